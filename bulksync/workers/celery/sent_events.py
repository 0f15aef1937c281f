"""The ``task-sent`` events of a step's messages, published together.

Celery publishes a ``task-sent`` event for each message it sends (Flower shows the task as
sent from it), one more broker round trip each: about half the time a coordinator spends
publishing a step. :class:`SentEvents` is handed to ``send_task`` as its event dispatcher and
keeps the events; :func:`publish_sent` then sends them as one message, a list of events, as
Celery's workers send theirs — event receivers, Flower's among them, take both.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

log = logging.getLogger(__name__)


class SentEvents:
    """The ``task-sent`` events of the messages sent with this as their event dispatcher."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **_: Any) -> None:
        """Keep the event Celery would publish now (its fields, ``type`` being
        ``task-sent``)."""
        self.events.append(fields)


def publish_sent(app: Celery, producer: Any, sent: SentEvents) -> None:
    """Publish ``sent``'s events as one message on ``producer``'s channel (that of the
    messages they describe). A broker error is logged, never raised: the tasks are sent,
    and only Flower's view of them is missed."""
    if not sent.events:
        return
    try:
        dispatcher = app.events.Dispatcher(
            channel=producer.channel,
            buffer_group={"task"},
            buffer_limit=len(sent.events) + 1,  # flushed below, not on its own
            buffer_while_offline=False,
        )
        for fields in sent.events:
            dispatcher.send("task-sent", **fields)
        dispatcher.flush(errors=False)
    except Exception as exc:
        log.warning("could not publish %d task-sent events: %s", len(sent.events), exc)
