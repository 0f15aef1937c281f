"""Celery's events published straight to a Redis broker are the messages kombu publishes.

Celery's own dispatcher and bulksync's send the same event; what each published is heard on
the events topics, and the two messages are compared field by field, less what is fresh on
every publish (the delivery tag, event times and clocks). A worker's events reaching an
event receiver, as Flower's does, is in ``test_operators.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.events import EventDispatcher
from tests.integration.test_publish import WAIT, events, listening

pytestmark = pytest.mark.integration


def stock_dispatcher(app: Any) -> Any:
    """Celery's own dispatcher class for ``app`` (what ``make_app`` replaces)."""
    return app.subclass_with_self(
        "celery.events.dispatcher:EventDispatcher", reverse="events.Dispatcher"
    )


def heard_both_ways(settings: Settings, send: Callable[[Any], None]) -> list[bytes]:
    """The messages ``send`` published with Celery's dispatcher, then with bulksync's, as
    an event receiver hears them (both dispatchers named by a hostname of this test's)."""
    app = make_app(settings)
    assert issubclass(app.events.Dispatcher, EventDispatcher)
    hostname = f"test-events-{uuid.uuid4().hex[:8]}@here"
    with listening(settings.redis_url, "*celeryev*") as listener:
        with app.connection_for_write() as conn:
            for kind in (stock_dispatcher(app), app.events.Dispatcher):
                with kind(conn, hostname=hostname, buffer_group={"task"}) as dispatcher:
                    send(dispatcher)
        heard: list[bytes] = []
        deadline = time.monotonic() + WAIT
        while len(heard) < 2 and time.monotonic() < deadline:
            got = listener.get_message(timeout=0.1)
            if got is not None and hostname.encode() in got["data"]:
                heard.append(got["data"])
    assert len(heard) == 2, heard
    return heard


def same_both_ways(heard: list[bytes]) -> list[dict[str, Any]]:
    """The events of two messages, once checked equal (envelopes and events)."""
    (celery_envelope, celery_events), (direct_envelope, direct_events) = map(events, heard)
    assert direct_envelope == celery_envelope
    assert direct_events == celery_events
    return direct_events


def test_a_flush_of_task_events_is_the_message_kombu_publishes(settings: Settings) -> None:
    def send(dispatcher: Any) -> None:
        dispatcher.send("task-received", uuid="t-1", name="bulksync.g:node", args="run=r")
        dispatcher.send("task-started", uuid="t-1")
        dispatcher.flush()

    found = same_both_ways(heard_both_ways(settings, send))
    assert [e["type"] for e in found] == ["task-received", "task-started"]


def test_an_event_sent_alone_is_the_message_kombu_publishes(settings: Settings) -> None:
    def send(dispatcher: Any) -> None:
        dispatcher.send("worker-heartbeat", freq=2.0, active=0, processed=3)

    heard = heard_both_ways(settings, send)
    assert [e["type"] for e in same_both_ways(heard)] == ["worker-heartbeat"]
    assert events(heard[1])[0]["properties"]["delivery_info"] == {
        "exchange": "celeryev",
        "routing_key": "worker.heartbeat",
    }


class Refusing:
    """A client whose publishes fail, as on a lost connection."""

    def __init__(self, connection_pool: Any) -> None:
        self.connection_pool = connection_pool

    def publish(self, topic: str, message: str) -> None:
        raise redis.ConnectionError("connection lost")


def test_an_event_the_direct_publish_fails_on_goes_through_kombu(settings: Settings) -> None:
    def send(dispatcher: Any) -> None:
        if isinstance(dispatcher, EventDispatcher):
            channel = dispatcher.producer.channel
            dispatcher._client(channel)
            dispatcher._direct = (channel, Refusing(channel.pool))
        dispatcher.send("task-succeeded", uuid="t-2", result="None", runtime=0.1)
        dispatcher.flush()

    found = same_both_ways(heard_both_ways(settings, send))
    assert [e["type"] for e in found] == ["task-succeeded"]


def test_on_a_broker_other_than_redis_events_go_through_kombu(settings: Settings) -> None:
    app = make_app(settings)
    with app.connection_for_write("memory://") as conn, app.events.Dispatcher(conn) as dispatcher:
        assert dispatcher._client(dispatcher.producer.channel) is None
        dispatcher.send("worker-heartbeat", freq=2.0)  # kombu's in-memory fanout takes it


def test_a_client_is_made_once_per_connection_pool_of_the_channel(settings: Settings) -> None:
    app = make_app(settings)
    with app.connection_for_write() as conn, app.events.Dispatcher(conn) as dispatcher:
        channel = dispatcher.producer.channel
        first = dispatcher._client(channel)
        assert first is not None and dispatcher._client(channel) is first
        channel._disconnect_pools()  # what kombu does in a forked child
        second = dispatcher._client(channel)
        assert second is not first and second.connection_pool is channel.pool
        dispatcher.send("worker-heartbeat", freq=2.0)
