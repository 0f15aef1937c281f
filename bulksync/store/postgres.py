"""``PostgresStore``: the store in Postgres, shared by every process of a cluster.

One row per item in ``bulksync_store`` (created by bulksync's migrations, see
``checkpoint/pg_migrations.py``): the namespace as its labels joined by ``.`` (labels cannot
hold one), the key, the value as ``jsonb``, its times and its expiry. A search by namespace
prefix uses the prefix index; filters run in SQL, as ``jsonb`` comparisons (numbers for the
ordering operators). Results come newest-updated first. Items with a TTL expire: reads skip
them, reads refresh them (unless told not to), and ``sweep_ttl`` deletes them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from bulksync.checkpoint import pg_migrations as pgm
from bulksync.checkpoint.pg_pool import RETRY_WINDOW, is_transient_postgres, open_pool
from bulksync.retry import retry
from bulksync.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    namespace_matches,
)

_LIVE = "(expires_at IS NULL OR expires_at > clock_timestamp())"
_COLUMNS = "prefix, key, value, created_at, updated_at"
_REFRESH = (
    "UPDATE bulksync_store SET expires_at = clock_timestamp() + ttl_minutes * interval '1 minute'"
    " WHERE ttl_minutes IS NOT NULL AND prefix = %s AND key = %s"
)
_NUMERIC = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


class PostgresStore(BaseStore):
    """A ``BaseStore`` in Postgres: items shared by every process, optional TTLs."""

    supports_ttl = True

    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        ttl: Mapping[str, Any] | None = None,
        retry_window: float = RETRY_WINDOW,
    ) -> None:
        self.pool = pool
        self.ttl_config = dict(ttl) if ttl is not None else None
        self.retry_window = retry_window
        self._setup_lock = threading.Lock()
        self._ready = False

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        url: str,
        *,
        max_size: int = 10,
        ttl: Mapping[str, Any] | None = None,
        connect_timeout: float = 10.0,
    ) -> Iterator[PostgresStore]:
        """A store on a pool of up to ``max_size`` connections to ``url`` for the block.

        ``ttl``: ``{"default_ttl": minutes, "refresh_on_read": bool}``.

        Raises:
            ServiceUnavailableError: Postgres does not accept a connection in time (naming
                the URL, password hidden).
        """
        pool = open_pool(
            url, max_size=max_size, connect_timeout=connect_timeout, name="bulksync-store"
        )
        try:
            yield cls(pool, ttl=ttl)
        finally:
            pool.close()

    def setup(self) -> None:
        """Apply the migrations the database lacks (the store's table); runs on first use."""
        with self._setup_lock, self.pool.connection() as conn:
            pgm.apply_migrations(conn, pgm.MIGRATIONS)
            self._ready = True

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order, in one transaction (retried whole through an outage)."""
        todo = list(ops)
        return retry(
            lambda: self._batch(todo),
            transient=is_transient_postgres,
            window=self.retry_window,
            what="Postgres store: a batch",
        )

    def sweep_ttl(self) -> int:
        """Delete the expired items; how many there were."""
        with self._cursor() as cur:
            cur.execute("DELETE FROM bulksync_store WHERE NOT " + _LIVE)
            return cur.rowcount

    def _batch(self, ops: list[Op]) -> list[Result]:
        results: list[Result] = []
        with self._cursor() as cur:
            for op in ops:
                if isinstance(op, GetOp):
                    results.append(_get(cur, op))
                elif isinstance(op, SearchOp):
                    results.append(_search(cur, op))
                elif isinstance(op, ListNamespacesOp):
                    results.append(_namespaces(cur, op))
                elif isinstance(op, PutOp):
                    _put(cur, op)
                    results.append(None)
                else:
                    raise ValueError(f"Unknown operation type: {type(op).__name__}")
        return results

    @contextmanager
    def _cursor(self) -> Iterator[psycopg.Cursor[Any]]:
        if not self._ready:
            self.setup()
        with self.pool.connection() as conn, conn.transaction():
            yield conn.cursor(row_factory=tuple_row)


def _prefix(namespace: tuple[str, ...]) -> str:
    return ".".join(namespace)


def _item(row: tuple[Any, ...], cls: type[Item] = Item) -> Any:
    prefix, key, value, created_at, updated_at = row
    return cls(value, key, tuple(prefix.split(".")), created_at, updated_at)


def _get(cur: psycopg.Cursor[Any], op: GetOp) -> Item | None:
    prefix = _prefix(op.namespace)
    if op.refresh_ttl:
        cur.execute(_REFRESH + " AND " + _LIVE, (prefix, op.key))
    cur.execute(
        f"SELECT {_COLUMNS} FROM bulksync_store WHERE prefix = %s AND key = %s AND {_LIVE}",
        (prefix, op.key),
    )
    row = cur.fetchone()
    return None if row is None else _item(row)


def _search(cur: psycopg.Cursor[Any], op: SearchOp) -> list[SearchItem]:
    if op.query:
        raise NotImplementedError(
            "search(query=...): bulksync's stores have no semantic (embedding) search yet; "
            "search with filter=... instead."
        )
    where, args = [_LIVE], []
    if op.namespace_prefix:
        prefix = _prefix(op.namespace_prefix)
        where.append("(prefix = %s OR starts_with(prefix, %s))")
        args += [prefix, prefix + "."]
    for key, wanted in (op.filter or {}).items():
        clause, clause_args = _filter_sql(key, wanted)
        where.append(clause)
        args += clause_args
    cur.execute(
        f"SELECT {_COLUMNS} FROM bulksync_store WHERE {' AND '.join(where)}"
        " ORDER BY updated_at DESC, prefix, key LIMIT %s OFFSET %s",
        (*args, op.limit, op.offset),
    )
    found = [_item(row, SearchItem) for row in cur.fetchall()]
    if op.refresh_ttl:
        for item in found:
            cur.execute(_REFRESH, (_prefix(item.namespace), item.key))
    return found


def _filter_sql(key: str, wanted: Any) -> tuple[str, list[Any]]:
    """The SQL condition for one filter entry, and its arguments."""
    if isinstance(wanted, Mapping) and any(str(k).startswith("$") for k in wanted):
        clauses, args = [], []
        for op, operand in wanted.items():
            if op == "$eq":
                clauses.append("value -> %s = %s::jsonb")
            elif op == "$ne":
                clauses.append("value -> %s IS DISTINCT FROM %s::jsonb")
            elif op in _NUMERIC:
                clauses.append(
                    f"(jsonb_typeof(value -> %s) = 'number' AND (value ->> %s)::float8 "
                    f"{_NUMERIC[op]} %s)"
                )
                args += [key, key, float(operand)]
                continue
            else:
                raise ValueError(f"Unsupported operator: {op}")
            args += [key, json.dumps(operand)]
        return "(" + " AND ".join(clauses) + ")", args
    return "value -> %s = %s::jsonb", [key, json.dumps(wanted)]


def _put(cur: psycopg.Cursor[Any], op: PutOp) -> None:
    prefix = _prefix(op.namespace)
    if op.value is None:
        cur.execute("DELETE FROM bulksync_store WHERE prefix = %s AND key = %s", (prefix, op.key))
        return
    cur.execute(
        "INSERT INTO bulksync_store (prefix, key, value, expires_at, ttl_minutes)"
        " VALUES (%s, %s, %s::jsonb,"
        " clock_timestamp() + %s * interval '1 minute', %s)"
        " ON CONFLICT (prefix, key) DO UPDATE SET value = EXCLUDED.value,"
        " updated_at = clock_timestamp(), expires_at = EXCLUDED.expires_at,"
        " ttl_minutes = EXCLUDED.ttl_minutes",
        (prefix, op.key, json.dumps(op.value), op.ttl, op.ttl),
    )


def _namespaces(cur: psycopg.Cursor[Any], op: ListNamespacesOp) -> list[tuple[str, ...]]:
    cur.execute(f"SELECT DISTINCT prefix FROM bulksync_store WHERE {_LIVE}")
    namespaces = [tuple(row[0].split(".")) for row in cur.fetchall()]
    for condition in op.match_conditions or ():
        namespaces = [ns for ns in namespaces if namespace_matches(condition, ns)]
    if op.max_depth is not None:
        namespaces = list({ns[: op.max_depth] for ns in namespaces})
    return sorted(namespaces)[op.offset : op.offset + op.limit]
