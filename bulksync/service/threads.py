"""Threads as the HTTP API names them: the ``bulksync_threads`` table (migration 9).

A thread's checkpoints and runs exist without it; the row adds what LangGraph's Agent Server
keeps for a thread — its metadata, when it was created and changed — and the graph it is
bound to::

    thread_id   text         the thread's id (``configurable.thread_id`` of its runs)
    graph_id    text         the graph of its first writer run (``pkg.module:attr``)
    metadata    jsonb        the caller's, merged by ``update``
    created_at, updated_at   timestamptz

``RunStore.create`` adds the row of a thread a writer run is the first to use (so threads
of ``Client``, ``RemoteGraph`` and the CLI are listed too) and touches it for later ones.
A thread's status is read from its runs: ``busy`` while a writer run is pending or running,
else that of its last writer run (``interrupted``, ``error``), else ``idle``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from bulksync.checkpoint.pg_pool import RETRY_WINDOW, is_transient_postgres
from bulksync.errors import ConfigError, ThreadExistsError
from bulksync.retry import retry

IDLE: Final = "idle"
BUSY: Final = "busy"
INTERRUPTED: Final = "interrupted"
ERROR: Final = "error"
STATUSES: Final = (IDLE, BUSY, INTERRUPTED, ERROR)
SORT_COLUMNS: Final = ("thread_id", "created_at", "updated_at", "status")
T = TypeVar("T")

# The status of a thread from its last writer run (reads are never a thread's business).
_STATUS_SQL = """CASE
    WHEN EXISTS (SELECT 1 FROM bulksync_runs r WHERE r.thread_id = t.thread_id
                 AND r.status IN ('pending', 'running')
                 AND r.kind NOT IN ('get_state', 'get_state_history')) THEN 'busy'
    ELSE coalesce((SELECT CASE r.status WHEN 'interrupted' THEN 'interrupted'
                                        WHEN 'error' THEN 'error' WHEN 'timeout' THEN 'error'
                                        ELSE 'idle' END
                   FROM bulksync_runs r WHERE r.thread_id = t.thread_id
                   AND r.kind NOT IN ('get_state', 'get_state_history')
                   ORDER BY r.seq DESC LIMIT 1), 'idle') END"""
_SELECT_SQL = f"""SELECT * FROM (SELECT t.thread_id, t.graph_id, t.metadata, t.created_at,
    t.updated_at, {_STATUS_SQL} AS status FROM bulksync_threads t) AS t"""


@dataclasses.dataclass(frozen=True, slots=True)
class Thread:
    """One row of ``bulksync_threads`` with the status its runs give it."""

    thread_id: str
    graph_id: str | None
    metadata: dict[str, Any]
    status: str
    created_at: datetime
    updated_at: datetime


class ThreadStore:
    """Threads in Postgres, through the pool the runs table uses."""

    def __init__(self, pool: ConnectionPool[Any], *, retry_window: float = RETRY_WINDOW) -> None:
        self.pool = pool
        self.retry_window = retry_window

    def _retry(self, call: Callable[[], T], what: str) -> T:
        return retry(
            call,
            transient=is_transient_postgres,
            window=self.retry_window,
            what=f"Postgres: {what}",
        )

    def create(
        self,
        thread_id: str | None = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        graph_id: str | None = None,
        if_exists: str = "raise",
    ) -> Thread:
        """Create a thread (a new id when none is given); return it.

        ``if_exists="do_nothing"`` returns the existing thread of that id instead.

        Raises:
            ThreadExistsError: the id is taken and ``if_exists`` is ``"raise"``.
            ConfigError: ``if_exists`` is neither ``"raise"`` nor ``"do_nothing"``.
        """
        if if_exists not in ("raise", "do_nothing"):
            raise ConfigError(f"if_exists={if_exists!r}: use 'raise' or 'do_nothing'")
        ident = thread_id or str(uuid.uuid4())
        check_id(ident)

        def insert() -> tuple[bool, Thread | None]:
            with self.pool.connection() as conn:
                added = conn.execute(
                    """INSERT INTO bulksync_threads (thread_id, graph_id, metadata)
                    VALUES (%s, %s, %s) ON CONFLICT (thread_id) DO NOTHING RETURNING 1""",
                    (ident, graph_id, Jsonb(dict(metadata or {}))),
                ).fetchone()
                return added is not None, _one(conn, ident)

        added, thread = self._retry(insert, f"creating thread {ident}")
        if not added and if_exists == "raise":
            raise ThreadExistsError(f"thread '{ident}' already exists; pass if_exists='do_nothing'")
        if thread is None:  # deleted as soon as it was created
            raise LookupError(f"thread '{ident}' was deleted while it was being created")
        return thread

    def get(self, thread_id: str) -> Thread | None:
        """The thread with this id, if it has a row."""

        def read() -> Thread | None:
            with self.pool.connection() as conn:
                return _one(conn, thread_id)

        found: Thread | None = self._retry(read, f"reading thread {thread_id}")
        return found

    def update(self, thread_id: str, metadata: Mapping[str, Any]) -> Thread | None:
        """Merge ``metadata`` into the thread's; the thread after, or None if it has no row."""

        def merge() -> Thread | None:
            with self.pool.connection() as conn:
                conn.execute(
                    """UPDATE bulksync_threads SET metadata = metadata || %s,
                    updated_at = clock_timestamp() WHERE thread_id = %s""",
                    (Jsonb(dict(metadata)), thread_id),
                )
                return _one(conn, thread_id)

        found: Thread | None = self._retry(merge, f"updating thread {thread_id}")
        return found

    def delete(self, thread_id: str) -> bool:
        """Delete the thread's row and its finished runs; whether it had a row."""

        def delete() -> bool:
            with self.pool.connection() as conn, conn.transaction():
                conn.execute(
                    "DELETE FROM bulksync_runs WHERE thread_id = %s AND status NOT IN "
                    "('pending', 'running')",
                    (thread_id,),
                )
                cur = conn.execute(
                    "DELETE FROM bulksync_threads WHERE thread_id = %s", (thread_id,)
                )
                return bool(cur.rowcount > 0)

        gone: bool = self._retry(delete, f"deleting thread {thread_id}")
        return gone

    def search(
        self,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: str | None = None,
        ids: Sequence[str] | None = None,
        graph_id: str | None = None,
        limit: int = 10,
        offset: int = 0,
        sort_by: str = "created_at",
        sort_order: str = "desc",
    ) -> list[Thread]:
        """Threads matching every filter given, sorted, a page of ``limit`` from ``offset``.

        Raises:
            ConfigError: an unknown status, sort column or order (named).
        """
        sql, params = self._where(metadata, status, ids, graph_id)
        if sort_by not in SORT_COLUMNS:
            raise ConfigError(f"sort_by={sort_by!r}: use one of {', '.join(SORT_COLUMNS)}")
        if sort_order.lower() not in ("asc", "desc"):
            raise ConfigError(f"sort_order={sort_order!r}: use 'asc' or 'desc'")
        sql += f" ORDER BY {sort_by} {sort_order.upper()}, thread_id LIMIT %s OFFSET %s"
        params += [max(0, int(limit)), max(0, int(offset))]

        def read() -> list[Thread]:
            with self.pool.connection() as conn:
                rows = conn.cursor(row_factory=dict_row).execute(sql, params).fetchall()
            return [_thread(r) for r in rows]

        found: list[Thread] = self._retry(read, "searching threads")
        return found

    def count(
        self,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: str | None = None,
        ids: Sequence[str] | None = None,
        graph_id: str | None = None,
    ) -> int:
        """How many threads match every filter given."""
        sql, params = self._where(metadata, status, ids, graph_id)

        def read() -> int:
            with self.pool.connection() as conn:
                row = conn.execute(f"SELECT count(*) FROM ({sql}) AS found", params).fetchone()
            return int(row[0]) if row else 0

        found: int = self._retry(read, "counting threads")
        return found

    @staticmethod
    def _where(
        metadata: Mapping[str, Any] | None,
        status: str | None,
        ids: Sequence[str] | None,
        graph_id: str | None,
    ) -> tuple[str, list[Any]]:
        if status is not None and status not in STATUSES:
            raise ConfigError(f"status={status!r}: use one of {', '.join(STATUSES)}")
        where: list[str] = []
        params: list[Any] = []
        if metadata:
            where.append("t.metadata @> %s::jsonb")
            params.append(json.dumps(dict(metadata)))
        if status is not None:
            where.append("t.status = %s")
            params.append(status)
        if ids is not None:
            where.append("t.thread_id = ANY(%s)")
            params.append(list(ids))
        if graph_id is not None:
            where.append("t.graph_id = %s")
            params.append(graph_id)
        sql = _SELECT_SQL + (" WHERE " + " AND ".join(where) if where else "")
        return sql, params


def check_id(thread_id: str) -> None:
    """Refuse a thread id Postgres text cannot hold.

    Raises:
        ConfigError: the id is empty or contains a NUL byte.
    """
    if not thread_id or "\x00" in thread_id:
        raise ConfigError(f"thread id {thread_id!r} is empty or holds a NUL byte; pass another")


def _one(conn: Connection[Any], thread_id: str) -> Thread | None:
    row = (
        conn.cursor(row_factory=dict_row)
        .execute(_SELECT_SQL + " WHERE t.thread_id = %s", (thread_id,))
        .fetchone()
    )
    return None if row is None else _thread(row)


def _thread(row: Mapping[str, Any]) -> Thread:
    return Thread(
        thread_id=row["thread_id"],
        graph_id=row["graph_id"],
        metadata=dict(row["metadata"] or {}),
        status=row["status"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
