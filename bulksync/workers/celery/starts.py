"""Counting the starts of reserved tasks on a worker, without waiting for Redis.

A task's delivery count (``keys.deliveries``) says how many times a worker started it; a task
that started ``max_deliveries`` times without a result is a poison task (``claims.py``). The
sync tasks of a message that run one by one are reserved together with the step's read and
counted one by one as each starts. A count must reach Redis before its task runs — a task
that kills its process must have been counted — but nothing waits for Redis's answer. So a
worker process writes its counts on a connection of its own, out of the pool, and reads the
replies in bulk long after they arrived (every ``UNREAD`` of them): a quick task starts
after a socket write, where a round trip (a wait for Redis, and for the CPU back) used to
cost more than the task itself.

A write that fails is retried through a Redis outage; the task starts only once its count
is written. After an idle second the connection is looked at before the next write (a
server that closed it shows then). A count that Redis refuses, or that a connection broken
after the write loses, is logged: its task ran, uncounted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import redis

from bulksync import keys
from bulksync.retry import is_transient_redis, retry
from bulksync.settings import Settings

log = logging.getLogger(__name__)

UNREAD: Final = 512
"""Replies left unread at most; then they are read (they arrived long ago: no wait)."""
IDLE: Final = 1.0
"""Seconds without a count after which the replies that arrived are read before the next
count is written: a connection the server closed meanwhile (an idle timeout, a restart)
shows there, and the count goes on a new one instead of being lost."""


class StartCounter:
    """One worker process's counts of task starts, on a Redis connection of its own."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._pool = client.connection_pool
        self.settings = settings
        self._conn: Any = None  # opened on the first count
        self._unread = 0
        self._sent = 0.0  # when a count was last written
        self._lock = threading.Lock()

    def count(self, slots: Sequence[str]) -> None:
        """Count a start of each of ``slots``: written to Redis when this returns."""
        if not slots:
            return
        commands: list[tuple[Any, ...]] = []
        for slot in slots:
            key = keys.deliveries(slot)
            commands += [("INCR", key), ("EXPIRE", key, self.settings.result_ttl)]
        retry(
            lambda: self._send(commands),
            transient=is_transient_redis,
            window=self.settings.retry_window,
            what=f"counting the start of task {slots[0]}"
            + (f" and {len(slots) - 1} more" if len(slots) > 1 else ""),
        )

    def _send(self, commands: list[tuple[Any, ...]]) -> None:
        with self._lock:
            try:
                if time.monotonic() - self._sent > IDLE:
                    self._read(self._connection(), arrived=True)
                conn = self._connection()  # (anew, if that found it closed)
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            except BaseException:
                self._drop()  # the replies owed on it go with it
                raise
            self._sent = time.monotonic()
            self._unread += len(commands)
            if self._unread >= UNREAD:
                self._read(conn)

    def close(self) -> None:
        """Read the replies owed, then close the connection (a later count opens one)."""
        with self._lock:
            if self._conn is not None:
                self._read(self._conn)
            self._drop()

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self._pool.connection_class(**self._pool.connection_kwargs)
        return self._conn

    def _read(self, conn: Any, *, arrived: bool = False) -> None:
        """Read the replies owed (under the lock), or only those that ``arrived``, without
        waiting: a connection the server closed shows there, before a count is written into
        it. Refused counts are logged; a broken connection is dropped."""
        refused: list[redis.ResponseError] = []
        try:
            while conn.can_read(timeout=0) if arrived else self._unread > 0:
                try:
                    conn.read_response()
                except redis.ResponseError as exc:
                    refused.append(exc)
                self._unread -= 1
        except redis.RedisError as exc:
            if self._unread > 0:
                log.warning("task starts written may not have been counted: %s", exc)
            self._drop()
        if refused:
            log.warning("Redis refused %d task start count(s): %s", len(refused), refused[0])

    def _drop(self) -> None:
        conn, self._conn, self._unread = self._conn, None, 0
        if conn is not None:
            conn.disconnect()
