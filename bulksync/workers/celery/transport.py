"""kombu's Redis transport, with one lean Redis client per connection pool, not one per call.

Outside its poll, kombu's Redis channel makes a new ``redis.Redis`` for every call it makes:
a worker's bookkeeping of each message it takes (``QoS.append``) and of each it acknowledges
(``QoS.ack``), each publish through kombu (task events included). Making one builds
redis-py's table of reply callbacks: 8% of the CPU of a busy prefork worker's main process
(py-spy), twice a message. The client holds no connection of its own (its pool lends one per
command or pipeline), so :class:`Channel` makes it once and gives the same one to every
call, until kombu replaces the channel's pool (after a fork, or a reconnection): then it
makes a new one. That client is a ``LeanRedis`` (``redis_lean.py``): redis-py's per-call
machinery (pool checkout, retry wrapper, hooks) costs more CPU than each of these small
calls' round trip. The poll's own client (``BRPOP``, the fanout subscription), one with a
key prefix or a credential provider, stay kombu's.

The app ``make_app`` builds connects through :class:`Connection` (its :class:`AMQP`), which
takes :class:`Transport` wherever kombu would take its plain Redis transport (``redis://``,
``rediss://``), and kombu's own transport for any other URL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery.app import amqp
from kombu import connection as kombu_connection
from kombu.transport import redis as kombu_redis

from bulksync.redis_lean import LeanRedis


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, its calls sharing one client per connection pool."""

    _shared: Any = None

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """``client``, else the channel's shared client (made again for a new pool)."""
        if client:
            yield client
            return
        shared = self._shared
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared = self._create_client()
        yield shared

    def _create_client(self, asynchronous: bool = False) -> Any:
        """A ``LeanRedis`` on the channel's pool for its calls; kombu's own client for its
        poll, and wherever kombu's client does more (a key prefix, a credential provider)."""
        if (
            asynchronous
            or self.global_keyprefix
            or self.pool.connection_kwargs.get("credential_provider")
        ):
            return super()._create_client(asynchronous)  # type: ignore[no-untyped-call]
        return LeanRedis(connection_pool=self.pool)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


class Connection(kombu_connection.Connection):
    """kombu's connection, on :class:`Transport` where kombu would take its Redis transport."""

    def get_transport_cls(self) -> type[Any]:
        """The transport kombu picks for this connection's URL, or :class:`Transport`."""
        chosen: type[Any] = super().get_transport_cls()  # type: ignore[no-untyped-call]
        return Transport if chosen is kombu_redis.Transport else chosen


class AMQP(amqp.AMQP):  # type: ignore[misc]
    """Celery's broker plumbing, connecting through :class:`Connection`."""

    Connection = Connection
    BrokerConnection = Connection
