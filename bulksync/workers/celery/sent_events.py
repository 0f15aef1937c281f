"""The ``task-sent`` events of a step's messages, published together.

Celery publishes a ``task-sent`` event for each message it sends (Flower shows the task as
sent from it), one more broker round trip each: about half the time a coordinator spends
publishing a step. :class:`SentEvents` is handed to ``send_task`` as its event dispatcher and
keeps the events; :meth:`EventBatcher.publish` then sends them as one message, a list of
events, as Celery's workers send theirs — event receivers, Flower's among them, take both.
"""

from __future__ import annotations

import logging
import threading
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


class EventBatcher:
    """Publishes collected ``task-sent`` events, one message for each call."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._dispatcher: Any = None
        self._lock = threading.Lock()

    def publish(self, sent: SentEvents) -> None:
        """Publish ``sent``'s events as one message; a broker error is logged, never raised:
        the tasks are sent, and only Flower's view of them is missed."""
        if not sent.events:
            return
        try:
            with self._lock:
                if self._dispatcher is None:
                    self._dispatcher = self.app.events.Dispatcher(
                        self.app.connection_for_write(),
                        buffer_group={"task"},
                        buffer_limit=2**31,  # flushed here, never on its own
                    )
                for fields in sent.events:
                    self._dispatcher.send("task-sent", **fields)
                self._dispatcher.flush(errors=False)
        except Exception as exc:
            log.warning("could not publish %d task-sent events: %s", len(sent.events), exc)
            with self._lock:  # a fresh connection next time; what it buffered is dropped
                dispatcher, self._dispatcher = self._dispatcher, None
            if dispatcher is not None:
                dispatcher.close()
