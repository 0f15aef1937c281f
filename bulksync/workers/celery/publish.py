"""A step's messages, published two ways: straight into a Redis broker, or through Celery.

**Straight into Redis.** Through Celery, publishing a message costs ``send_task``'s building
and routing, kombu's producer, a Redis client made for the call, a round trip for the
message and another for its ``task-sent`` event: half of what a coordinator spends on a
one-task step, and two of its four round trips. When the broker is the Redis server and
database that hold the steps, :class:`DirectPublisher` writes the bytes kombu's Redis
transport would write — each message ``LPUSH``-ed on its queue's list, the step's
``task-sent`` events ``PUBLISH``-ed as one list on the events topic — as commands of the
pipeline that stores the step. Workers and Flower cannot tell the difference.

The message itself is still Celery's: its headers, properties, body and sent event come from
``app.amqp.as_task_v2``, its body bytes from kombu's serializer. What is written here is the
transport's envelope around it, as kombu writes it for Celery's route to a direct queue (an
anonymous exchange), priority 0, no compression.

**Through Celery** (:func:`send`): ``send_task`` per message, on one producer. Celery
publishes a ``task-sent`` event per message, one more broker round trip each; the events are
kept instead and sent as one message, a list of events, as Celery's workers send theirs —
event receivers, Flower's among them, take both.

Celery's way is taken wherever the direct bytes could differ: a broker other than that Redis
database through kombu's plain Redis transport, a ``global_keyprefix``, custom priority steps
or key separator, task compression or routes, another task protocol (checked once,
:meth:`DirectPublisher.for_app`); and while anything listens to Celery's publish signals, so
that their receivers (tracing, say) keep seeing every message (checked at each step,
:meth:`DirectPublisher.usable`).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import logging
import math
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from celery import Celery, signals
from celery.events import Event
from celery.utils.nodenames import anon_nodename
from celery.utils.time import utcoffset
from kombu import entity, serialization
from kombu.utils import json
from redis import connection

from bulksync import keys
from bulksync.coordinator.plan import Task
from bulksync.settings import Settings
from bulksync.workers.celery.node_task import MESSAGE_HEADER
from bulksync.workers.registry import task_name
from bulksync.workers.wire import TaskDescriptor

log = logging.getLogger(__name__)

# kombu's and redis-py's helpers, typed for this module (they ship no annotations).
maybe_delivery_mode: Callable[[Any], int] = entity.maybe_delivery_mode
dumps: Callable[..., tuple[str, str, bytes | str]] = serialization.dumps
json_dumps: Callable[[Any], str] = json.dumps
parse_url: Callable[[str], dict[str, Any]] = connection.parse_url

EVENTS_ROUTING_KEY = "task.multi"
"""The routing key of a list of task events (what Celery's event dispatcher sends)."""


def batch_size(count: int, settings: Settings, *, is_async: bool = False) -> int:
    """Tasks per message for a fan-out of ``count`` tasks of one node.

    About ``settings.target_messages`` messages (fewer for small fan-outs), at most
    ``settings.max_batch`` tasks in each, or ``max_async_batch`` for an async node: a
    worker runs a message's async tasks all at once, so more of them ride in one message
    before messages must wait for a free pool slot.
    """
    most = settings.max_async_batch if is_async else settings.max_batch
    return max(1, min(most, math.ceil(count / settings.target_messages)))


_LIMIT_SLACK: Final = 10.0
"""Seconds a message's hard time limit adds to its tasks' own (reading and recording)."""

Batch = tuple[str, str, list[Task]]
"""A message of a step: its node, its id, its tasks."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outgoing:
    """One message of a step, as ``send_task`` is given it."""

    name: str
    args: list[Any]
    task_id: str
    queue: str
    headers: dict[str, Any]
    argsrepr: str
    time_limit: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class StepMessages:
    """What each message of one step carries besides its tasks."""

    graph_id: str
    path: tuple[str, ...]
    step_key: str
    run_id: str
    thread: str
    timeout: float | None
    """The task time limit (per task: a message of N tasks gets N times it, and 10 s)."""

    def of(
        self,
        batches: Sequence[Batch],
        describe: Callable[[Task], TaskDescriptor],
        queue_of: Callable[[Task], str],
    ) -> list[Outgoing]:
        """The message of each batch: a node task's arguments (a message of several tasks
        names the step-hash field listing them), named for Flower by ids, never state."""
        messages = []
        for node, message_id, chunk in batches:
            first, count = chunk[0], len(chunk)
            tasks = first.id if count == 1 else f"{first.id} +{count - 1}"
            descs: Any = keys.batch_field(message_id) if count > 1 else [describe(first).pack()]
            messages.append(
                Outgoing(
                    name=task_name(self.graph_id, self.path, node),
                    args=[
                        self.graph_id,
                        list(self.path),
                        self.step_key,
                        self.run_id,
                        self.timeout,
                        descs,
                    ],
                    task_id=message_id,
                    queue=queue_of(first),
                    headers={MESSAGE_HEADER: self.graph_id},
                    argsrepr=(
                        f"run={self.run_id or '-'} thread={self.thread or '-'} "
                        f"step={first.step} node={first.name} task={tasks}"
                    ),
                    time_limit=(self.timeout * count + _LIMIT_SLACK) if self.timeout else None,
                )
            )
        return messages


def merge(messages: Sequence[Outgoing], most: int) -> tuple[list[Outgoing], set[str]]:
    """``messages``, those of one task each for the same node task and queue (of different
    steps: runs published together) joined ``most`` at a time into one message; the ids of
    the messages joined.

    A joined message carries ``[graph id, subgraph path, [[step key, run id, timeout,
    [descriptor]], …]]``: one group per message it replaces, each run by the worker as that
    message would have been (``node_task.py``). Its id is fresh, its time limit the sum of
    theirs, and Flower names every task in it.
    """
    alone: list[Outgoing] = []
    kinds: dict[tuple[str, str], list[tuple[str, Outgoing]]] = {}
    for m in messages:
        step = _one_task_step(m) if most > 1 else None
        if step is None:
            alone.append(m)
        else:
            kinds.setdefault((m.name, m.queue), []).append((step, m))
    out, joined = alone, set[str]()
    for same in kinds.values():
        for chunk in _chunks(same, most):
            if len(chunk) == 1:
                out.append(chunk[0])
                continue
            first = chunk[0]
            limits = [m.time_limit for m in chunk if m.time_limit is not None]
            out.append(
                dataclasses.replace(
                    first,
                    args=[first.args[0], first.args[1], [m.args[2:] for m in chunk]],
                    task_id=uuid.uuid4().hex,
                    argsrepr=" | ".join(m.argsrepr for m in chunk),
                    time_limit=(
                        sum(limits) - _LIMIT_SLACK * (len(chunk) - 1)
                        if len(limits) == len(chunk)
                        else None
                    ),
                )
            )
            joined.update(m.task_id for m in chunk)
    return out, joined


def _one_task_step(m: Outgoing) -> str | None:
    """The step key of ``m`` when it carries one task, its descriptor inline (as
    ``StepMessages.of`` builds it); None for any other message."""
    args = m.args
    one = len(args) == 6 and isinstance(args[5], list) and len(args[5]) == 1
    return str(args[2]) if one else None


def _chunks(messages: list[tuple[str, Outgoing]], most: int) -> list[list[Outgoing]]:
    """``messages`` (each with its step key) in chunks of up to ``most``, no two of one step
    in a chunk: a step's own messages stay apart, as its fan-out was split to spread over the
    workers."""
    chunks: list[list[tuple[str, Outgoing]]] = []
    for step, m in messages:
        chunk = next((c for c in chunks if len(c) < most and all(s != step for s, _ in c)), None)
        if chunk is None:
            chunks.append(chunk := [])
        chunk.append((step, m))
    return [[m for _, m in chunk] for chunk in chunks]


def send(app: Celery, messages: Sequence[Outgoing]) -> None:
    """Publish ``messages`` through ``send_task`` on one producer, then their ``task-sent``
    events as one message on the same channel."""
    sent = _SentEvents()
    with app.producer_or_acquire() as producer:
        for m in messages:
            app.send_task(
                m.name,
                args=m.args,
                task_id=m.task_id,
                queue=m.queue,
                producer=producer,
                headers=m.headers,
                argsrepr=m.argsrepr,
                kwargsrepr="{}",
                time_limit=m.time_limit,
                event_dispatcher=sent,
            )
        _publish_sent(app, producer, sent)


class _SentEvents:
    """The ``task-sent`` events of the messages sent with this as their event dispatcher."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **_: Any) -> None:
        """Keep the event Celery would publish now (its fields, ``type`` being
        ``task-sent``)."""
        self.events.append(fields)


def _publish_sent(app: Celery, producer: Any, sent: _SentEvents) -> None:
    """Publish ``sent``'s events as one message on ``producer``'s channel. A broker error is
    logged, never raised: the tasks are sent, and only Flower's view of them is missed."""
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


class DirectPublisher:
    """Queues node-task messages and their ``task-sent`` events on a Redis pipeline."""

    def __init__(self, app: Celery, events_topic: str) -> None:
        self.app = app
        self.events_topic = events_topic
        # Read once, as the events topic is: a lookup in Celery's settings costs a message
        # more than its own encoding does.
        conf = app.conf
        self.delivery_mode = maybe_delivery_mode(conf.task_default_delivery_mode)
        self._sent_event = bool(conf.task_send_sent_event)
        self._serializer = conf.task_serializer
        self._event_serializer = conf.event_serializer
        self._event_exchange = conf.event_exchange

    @classmethod
    def for_app(cls, app: Celery, settings: Settings) -> DirectPublisher | None:
        """A publisher for ``app``'s broker, or None when its bytes could differ from
        kombu's (see the module's docstring): then ``send_task`` publishes."""
        from kombu.transport import redis as kombu_redis

        from bulksync.workers.celery import transport

        conf = app.conf
        if conf.task_protocol != 2 or conf.task_compression or conf.task_routes:
            return None
        conn = app.connection_for_write()
        try:
            if type(conn.transport) not in (kombu_redis.Transport, transport.Transport):
                return None
            options = conn.transport_options or {}
            if options.get("global_keyprefix") or "sep" in options:
                return None
            if options.get("priority_steps", [0])[0] != 0:
                return None
            db = _broker_db(conn.virtual_host)
            broker = (conn.hostname or "127.0.0.1", conn.port or 6379, db)
        finally:
            conn.release()
        if "://" in broker[0] or broker != _redis_address(settings.redis_url):
            return None  # a socket URL, or another server or database than the steps'
        prefix = options.get("fanout_prefix", True)
        fanout = prefix if isinstance(prefix, str) else (f"/{db}." if prefix else "")
        if options.get("fanout_patterns", True):
            topic = f"{fanout}{conf.event_exchange}/{EVENTS_ROUTING_KEY}"
        else:
            topic = f"{fanout}{conf.event_exchange}"
        return cls(app, topic)

    @staticmethod
    def usable() -> bool:
        """Whether messages may skip ``send_task`` now: nothing listens to its signals."""
        return not (
            signals.before_task_publish.receivers
            or signals.after_task_publish.receivers
            or signals.task_sent.receivers
        )

    def queue(self, pipe: Any, messages: Sequence[Outgoing]) -> None:
        """Queue on ``pipe`` each of ``messages`` and, as one more command, their
        ``task-sent`` events (when the app sends them)."""
        root_id = parent_id = None
        parent = self.app.current_worker_task  # as send_task links a task's children
        if parent is not None:
            root_id = parent.request.root_id or parent.request.id
            parent_id = parent.request.id
        sent_events: list[dict[str, Any]] = []
        for m in messages:
            headers, properties, body, sent = self.app.amqp.as_task_v2(
                m.task_id,
                m.name,
                m.args,
                {},
                reply_to=self.app.thread_oid,
                time_limit=m.time_limit,
                create_sent_event=self._sent_event,
                root_id=root_id,
                parent_id=parent_id,
                ignore_result=None,
                argsrepr=m.argsrepr,
                kwargsrepr="{}",
            )
            headers.update(m.headers)
            # send_task leaves its unused options among the properties: these two.
            properties.update(argsrepr=m.argsrepr, kwargsrepr="{}")
            properties["delivery_mode"] = self.delivery_mode
            route = {"exchange": "", "routing_key": m.queue}
            content_type, encoding, data = dumps(body, serializer=self._serializer)
            pipe.lpush(m.queue, envelope(data, content_type, encoding, headers, properties, route))
            if sent is not None:
                sent.update(queue=m.queue, exchange="", routing_key=m.queue)
                sent_events.append(sent)
        if sent_events:
            self._queue_events(pipe, sent_events)

    def _queue_events(self, pipe: Any, sent: list[dict[str, Any]]) -> None:
        """The ``task-sent`` events as one list message, as Celery's dispatcher sends its
        buffered events (any event receiver, Flower's among them, takes both)."""
        pid = os.getpid()
        hostname, offset = _sender_name(pid), utcoffset()
        clock = self.app.clock
        events = [
            Event(
                "task-sent",
                hostname=hostname,
                utcoffset=offset,
                pid=pid,
                clock=clock.forward(),
                **f,
            )
            for f in sent
        ]
        content_type, encoding, data = dumps(events, serializer=self._event_serializer)
        route = {"exchange": self._event_exchange, "routing_key": EVENTS_ROUTING_KEY}
        properties = {"delivery_mode": 1}  # events are transient
        message = envelope(data, content_type, encoding, {"hostname": hostname}, properties, route)
        pipe.publish(self.events_topic, message)


@functools.lru_cache(maxsize=4)
def _sender_name(pid: int) -> str:
    """Celery's name for a process that sends events without being a worker (``gen<pid>@host``),
    made once per process (``pid``: a forked child makes its own)."""
    return str(anon_nodename())


def envelope(
    data: bytes | str,
    content_type: str,
    encoding: str,
    headers: dict[str, Any],
    properties: dict[str, Any],
    route: dict[str, str],
) -> str:
    """The JSON kombu's Redis transport stores for a message: its body base64-encoded, its
    route and a fresh delivery tag among its properties."""
    raw = data.encode(encoding) if isinstance(data, str) else data
    properties.update(
        delivery_info=route,
        priority=0,
        body_encoding="base64",
        delivery_tag=str(uuid.uuid4()),
    )
    message = {
        "body": base64.b64encode(raw).decode(),
        "content-encoding": encoding,
        "content-type": content_type,
        "headers": headers,
        "properties": properties,
    }
    return json_dumps(message)


def _broker_db(virtual_host: Any) -> int | None:
    """The database number of a Redis broker's virtual host (None: not a number)."""
    if isinstance(virtual_host, int):
        return virtual_host
    text = (virtual_host or "").lstrip("/")
    return int(text) if text.isdigit() else (0 if not text else None)


def _redis_address(url: str) -> tuple[str, int, int] | None:
    """Host, port and database of a TCP Redis URL (None for a socket URL)."""
    params = parse_url(url)
    if "path" in params:
        return None
    return (
        params.get("host") or "localhost",
        int(params.get("port") or 6379),
        int(params.get("db") or 0),
    )
