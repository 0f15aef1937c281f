"""The Celery app bulksync workers consume from and coordinators publish to.

Settings chosen for correctness first:

- **msgpack** messages (kombu's serializer; JSON and pickle are refused);
- **late acks** and **reject on worker lost**: a message is acknowledged after its tasks ran,
  and a worker process killed mid-task puts its message back for another worker (results
  are keyed by task id and the first one wins, so running twice records once);
- **prefetch 1** per pool slot, so a long node never holds back messages another slot could
  take (small tasks are batched per message instead);
- **task events on**, including "sent", so Flower shows queued tasks under their node names
  (published by ``events.EventDispatcher``: on a Redis broker without kombu's per-event cost;
  a worker's held for ``events_hold`` seconds and sent together, ``BulkSyncConsumer``);
- **no result backend**: results go to Redis keys the coordinator blocks on;
- on a Redis broker, kombu's transport with one Redis client per connection pool rather than
  one made per call (``transport.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer

from bulksync import logs
from bulksync.settings import Settings

log = logging.getLogger(__name__)


def make_app(settings: Settings) -> Celery:
    """A Celery app for ``settings``'s broker (Redis or RabbitMQ, by URL)."""
    app = Celery(
        "bulksync",
        broker=settings.broker_url,
        set_as_current=False,
        events="bulksync.workers.celery.events:Events",
        amqp="bulksync.workers.celery.transport:AMQP",
    )
    app.conf.update(
        task_serializer="msgpack",
        accept_content=["msgpack"],
        result_backend=None,
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_default_queue=settings.queue,
        task_create_missing_queues=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options=broker_transport_options(settings),
        worker_consumer="bulksync.workers.celery.app:BulkSyncConsumer",
        worker_hijack_root_logger=False,
        bulksync_events_hold=settings.events_hold,  # BulkSyncConsumer's
    )
    return app


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """Redis broker options: how long an unacknowledged message waits, and how often it is
    looked for.

    kombu sweeps the unacked set every ``unacked_restore_interval`` seconds but scans only on
    every ``unacked_restore_throttle``-th sweep (defaults 10 and 10: every ~100 s), whatever
    the visibility timeout. Scanning on every sweep, at least twice per visibility timeout
    (at most every 10 s), makes a dead worker's messages come back soon after it expires.
    """
    every = max(1.0, min(10.0, settings.visibility_timeout / 2))
    return {
        "visibility_timeout": settings.visibility_timeout,
        "unacked_restore_interval": every,
        "unacked_restore_throttle": 1,
    }


class BulkSyncConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, answering a message for a graph this worker did not load.

    Celery would log and drop such a message, leaving its coordinator waiting; this one
    records an ``UnknownGraphError`` result for each of its tasks, so the run fails at once
    with a message naming the graph and the ``--graph`` option to load it. A message with
    bulksync's header whose arguments are not a node task's is logged once and rejected
    without requeue: anyone who can publish to the broker must not take workers down.
    """

    connection_errors: tuple[type[BaseException], ...]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events_held = False  # a send of the held task events is scheduled
        # After a Redis broker restart, acking a message of the torn-down connection fails
        # inside kombu with an AttributeError (its connection info is gone), which Celery
        # would treat as fatal and exit. Counted as a connection error, it is logged and the
        # consumer reconnects; the message is restored after the visibility timeout, and its
        # task, whose result is recorded, is not run again.
        self.connection_errors = (*self.connection_errors, AttributeError)

    def on_send_event_buffered(self) -> None:
        """Send the task events held now, and those of the next ``events_hold`` seconds,
        together then (the dispatcher sends at once when 24 are held).

        Celery sends them at its loop's next turn: with short tasks, a message for each
        event, a quarter of the CPU of a busy worker's main process. Called from any thread
        (a thread pool's tasks send their own events): the timer is set on the loop's.
        """
        if not self.hub or self._events_held:
            return
        self._events_held = True
        self.hub.call_soon(self._hold_events)

    def _hold_events(self) -> None:
        self.hub.call_later(self.app.conf.bulksync_events_hold, self._send_held_events)

    def _send_held_events(self) -> None:
        self._events_held = False  # first: an event held from now on schedules a send
        self._flush_events()

    def shutdown(self) -> None:
        """Send the task events held, then shut down."""
        self._flush_events()
        super().shutdown()

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        """Go on to reconnect even when closing the lost connection fails inside kombu.

        With a Redis broker, closing the dead connection restores the unacknowledged
        messages, which needs a fresh connection from a connection kombu has already torn
        down: an ``AttributeError`` that Celery takes for an unrecoverable error, and the
        worker exits for good after a Redis restart. The messages stay in the unacked set,
        where they are restored after the visibility timeout like any dead worker's.
        """
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as err:
            log.warning(
                "closing the lost broker connection failed inside kombu (%r); reconnecting", err
            )

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        from bulksync.workers.celery.node_task import current_runtime

        runtime = current_runtime()
        try:
            if runtime is not None and runtime.reject_unknown(message):
                message.ack()
                return
        except Exception as error:
            # Raising here would end the worker and leave the message to the next worker,
            # which it would end too: log it once and drop it.
            headers = message.headers or {}
            log.error(
                "message %s (task %r): rejected, not requeued: malformed bulksync message (%s: %s)",
                headers.get("id"),
                headers.get("task"),
                type(error).__name__,
                error,
                extra=logs.ids(message_id=headers.get("id")),
            )
            message.reject(requeue=False)
            return
        super().on_unknown_task(body, message, exc)
