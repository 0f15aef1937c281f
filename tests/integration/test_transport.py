"""The broker transport of ``make_app``'s app: kombu's Redis transport, one lean client per pool."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
import redis
from kombu.transport import memory, pyamqp

from bulksync.redis_lean import LeanRedis
from bulksync.settings import Settings
from bulksync.workers.celery import transport
from bulksync.workers.celery.app import make_app

pytestmark = pytest.mark.integration


def test_a_channel_makes_one_client_per_connection_pool(settings: Settings, redis_url: str) -> None:
    app = make_app(settings)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, transport.Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as again:
            assert first is again
            assert first.connection_pool is channel.pool
            assert isinstance(first, LeanRedis)
        assert not isinstance(channel.client, LeanRedis)  # the poll's own stays kombu's
        given = redis.Redis.from_url(redis_url)
        with channel.conn_or_acquire(given) as passed:
            assert passed is given  # a caller's own client is used as it is
        given.close()
        channel._pool = None  # as kombu leaves it after a fork: a new pool next
        with channel.conn_or_acquire() as fresh:
            assert fresh is not first
            assert fresh.connection_pool is channel.pool
            assert fresh.ping()


def test_a_key_prefix_keeps_kombus_own_client(settings: Settings) -> None:
    app = make_app(settings)
    options = app.conf.broker_transport_options
    app.conf.broker_transport_options = {**options, "global_keyprefix": "bulksync-test:"}
    with app.connection_for_write() as conn, conn.default_channel.conn_or_acquire() as client:
        assert not isinstance(client, LeanRedis)  # kombu's prefixing client
        assert client.ping()


def test_messages_are_taken_and_acknowledged_through_the_shared_client(
    settings: Settings, redis_client: redis.Redis
) -> None:
    """A message taken is kept in the unacked set until its ack removes it, as with kombu's
    own channel: both go through the channel's shared client."""
    app = make_app(settings)
    name = f"bulksync-test-transport-{uuid.uuid4().hex[:8]}"
    try:
        with app.connection_for_write() as conn, conn.SimpleQueue(name) as queue:
            for i in range(3):
                queue.put({"i": i})
            taken = [queue.get(timeout=5) for _ in range(3)]
            assert sorted(m.payload["i"] for m in taken) == [0, 1, 2]
            tags = {m.delivery_tag for m in taken}
            assert tags <= {t.decode() for t in redis_client.hkeys("unacked")}
            for message in taken:
                message.ack()
            assert not tags & {t.decode() for t in redis_client.hkeys("unacked")}
            assert redis_client.llen(name) == 0
    finally:
        redis_client.delete(name)


def test_other_brokers_keep_kombus_transport(settings: Settings) -> None:
    amqp = make_app(dataclasses.replace(settings, broker_url="amqp://guest@127.0.0.1:5672//"))
    with amqp.connection_for_write() as conn:
        assert type(conn.transport) is pyamqp.Transport
    with make_app(settings).connection_for_write("memory://") as conn:
        assert type(conn.transport) is memory.Transport
