"""A step's messages written straight into Redis are the bytes ``send_task`` writes.

Both ways publish the same message on a queue of the test's own, and the same ``task-sent``
events on the events topic; what each left in Redis is read back and compared, field by
field, less what is fresh on every publish (the delivery tag, event times and clocks).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import pytest
import redis
from celery.signals import before_task_publish

from bulksync.graph import END, START, StateGraph
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.node_task import MESSAGE_HEADER
from bulksync.workers.celery.publish import DirectPublisher, Outgoing, send

pytestmark = pytest.mark.integration

WAIT = 10.0
"""Longest a test waits for a published event (a liveness bound)."""


@pytest.fixture
def own_queue(settings: Settings, redis_url: str) -> Iterator[Settings]:
    queue = f"bulksync-test-publish-{uuid.uuid4().hex[:8]}"
    yield dataclasses.replace(settings, queue=queue)
    with redis.Redis.from_url(redis_url) as r:
        r.delete(queue)


def message(queue: str, task_id: str) -> Outgoing:
    return Outgoing(
        name="bulksync.tests.graph:node",
        args=["tests.graph:graph", ["sub"], "step-key", "run-1", 30.0, [[b"desc", 1]]],
        task_id=task_id,
        queue=queue,
        headers={MESSAGE_HEADER: "tests.graph:graph"},
        argsrepr="run=run-1 thread=t step=3 node=node task=abc",
        time_limit=40.0,
    )


def fields(envelope: bytes) -> dict[str, Any]:
    """A stored message, its body decoded, less its delivery tag."""
    found: dict[str, Any] = json.loads(envelope)
    del found["properties"]["delivery_tag"]
    found["body"] = base64.b64decode(found["body"])
    return found


def events(envelope: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An events message, and its events (one, or a list) less what each publish makes
    fresh."""
    found = fields(envelope)
    body = json.loads(found.pop("body"))
    listed = body if isinstance(body, list) else [body]
    for event in listed:
        for fresh in ("timestamp", "clock", "local_received"):
            event.pop(fresh, None)
    return found, listed


@contextlib.contextmanager
def listening(redis_url: str, pattern: str) -> Iterator[Any]:
    """A pubsub of the Redis at ``redis_url``, subscribed to the channels ``pattern`` (a glob)
    matches by the time the block starts."""
    with (
        redis.Redis.from_url(redis_url) as r,
        r.pubsub(ignore_subscribe_messages=True) as listener,
    ):
        listener.psubscribe(pattern)
        while listener.get_message(timeout=WAIT) is None and not listener.subscribed:
            pass
        yield listener


def published_both_ways(settings: Settings) -> tuple[list[bytes], list[bytes]]:
    """What each way left in Redis: the messages, then the events envelopes."""
    app = make_app(settings)
    direct = DirectPublisher.for_app(app, settings)
    assert direct is not None, "the test's broker is its Redis: the direct path applies"
    with (
        redis.Redis.from_url(settings.redis_url) as r,
        listening(settings.redis_url, direct.events_topic) as listener,
    ):
        task_id = str(uuid.uuid4())
        send(app, [message(settings.queue, task_id)])
        pipe = r.pipeline(transaction=False)
        direct.queue(pipe, [message(settings.queue, task_id)])
        pipe.execute()
        stored = [r.rpop(settings.queue), r.rpop(settings.queue)]
        heard: list[bytes] = []
        deadline = time.monotonic() + WAIT
        while len(heard) < 2 and time.monotonic() < deadline:
            got = listener.get_message(timeout=0.1)
            # Only this test's: the session's worker may still be sending events of its tasks.
            if got is not None and any(e.get("uuid") == task_id for e in events(got["data"])[1]):
                heard.append(got["data"])
    assert all(isinstance(m, bytes) for m in stored) and len(heard) == 2
    return stored, heard  # type: ignore[return-value]


def test_a_message_written_directly_is_the_one_send_task_writes(own_queue: Settings) -> None:
    stored, heard = published_both_ways(own_queue)
    through_celery, direct = fields(stored[0]), fields(stored[1])
    assert direct == through_celery
    assert direct["headers"]["timelimit"] == [40.0, None]
    assert direct["properties"]["delivery_info"] == {"exchange": "", "routing_key": own_queue.queue}
    # Its task-sent event too: same envelope, same event.
    (celery_envelope, celery_events), (direct_envelope, direct_events) = map(events, heard)
    assert direct_envelope == celery_envelope
    assert direct_events == celery_events
    assert [e["type"] for e in direct_events] == ["task-sent"]
    assert direct_events[0]["queue"] == own_queue.queue


class Count(TypedDict):
    n: int


def one_step(cluster: Any) -> Any:
    """``START`` -> ``inc`` -> ``END`` on the test worker: one message."""
    builder = StateGraph(Count)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    return cluster.attach(builder.compile())


def test_with_nothing_listening_a_step_is_published_without_send_task(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = one_step(cluster)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("send_task was called")

    monkeypatch.setattr(cluster.app, "send_task", refuse)
    assert graph.invoke({"n": 1}) == {"n": 2}


def test_while_something_listens_to_celerys_publish_signals_it_sees_every_message(
    cluster: Any,
) -> None:
    graph = one_step(cluster)
    seen: list[str] = []
    listen: Callable[..., None] = lambda headers, **_: seen.append(headers["task"])  # noqa: E731
    before_task_publish.connect(listen, weak=False)
    try:
        assert graph.invoke({"n": 1}) == {"n": 2}
    finally:
        before_task_publish.disconnect(listen)
    assert len(seen) == 1 and seen[0].endswith("inc")
