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

A count that Redis refuses, or that a broken connection loses after it was written, is
logged: its task ran, uncounted. A write that fails is retried through a Redis outage; the
task starts only once its count is written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

import redis

from bulksync import keys
from bulksync.retry import is_transient_redis, retry
from bulksync.settings import Settings

log = logging.getLogger(__name__)

UNREAD: Final = 512
"""Replies left unread at most; then they are read (they arrived long ago: no wait)."""


class StartCounter:
    """One worker process's counts of task starts, on a Redis connection of its own."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._pool = client.connection_pool
        self.settings = settings
        self._conn: Any = None  # opened on the first count
        self._unread = 0
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
            if self._conn is None:
                self._conn = self._pool.connection_class(**self._pool.connection_kwargs)
            conn = self._conn
            try:
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            except BaseException:
                self._drop()  # the replies owed on it go with it
                raise
            self._unread += len(commands)
            if self._unread >= UNREAD:
                self._read()

    def _read(self) -> None:
        """Read the replies owed (under the lock)."""
        conn, unread, self._unread = self._conn, self._unread, 0
        refused: list[redis.ResponseError] = []
        try:
            for _ in range(unread):
                try:
                    conn.read_response()
                except redis.ResponseError as exc:
                    refused.append(exc)
        except redis.RedisError as exc:
            log.warning("task starts written may not have been counted: %s", exc)
            self._drop()
            return
        if refused:
            log.warning("Redis refused %d task start count(s): %s", len(refused), refused[0])

    def _drop(self) -> None:
        conn, self._conn, self._unread = self._conn, None, 0
        if conn is not None:
            conn.disconnect()
