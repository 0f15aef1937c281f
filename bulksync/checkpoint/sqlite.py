"""``SqliteSaver``: the embedded default saver, on the standard library's ``sqlite3``.

Tables (created by ``setup()`` from the append-only ``MIGRATIONS``, each recorded in
``checkpoint_migrations`` once applied)::

    checkpoints        one row per checkpoint: the record without channel values
                       (``serde.dumps_checkpoint``), its parent's id and metadata as JSON
    checkpoint_blobs   one row per (thread, ns, channel, version): the channel's value, written
                       only when ``put`` lists the channel in ``new_versions``; NULL = empty
    checkpoint_writes  pending writes keyed (thread, ns, checkpoint, task id, idx)

A channel that did not change costs nothing per step. A (channel, version) written again
replaces the row: a fork (``update_state`` on an old checkpoint) reuses version numbers, and
the newest branch must read its own values. Regular writes are ``INSERT OR IGNORE`` (first
write wins), special writes are upserted (last one wins). ``list`` reads a page of
checkpoints, then all of their blobs and writes with one query each, not one per checkpoint.

One ``threading.Lock`` serializes use of the connection, so a saver may be shared by threads;
several processes may share a file (WAL mode, ``BEGIN IMMEDIATE`` for every write).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from bulksync.checkpoint.appends import Chains
from bulksync.checkpoint.async_methods import AsyncSaverMethods
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointTuple,
    Serde,
    blob_rows,
    checkpoint_config,
    config_thread,
    keyset_pages,
    list_where,
    write_rows,
    writes_sort_key,
)
from bulksync.checkpoint.serde import (
    MsgpackSerde,
    dumps_checkpoint,
    dumps_metadata,
    loads_checkpoint,
    loads_metadata,
)

MIGRATIONS: tuple[str, ...] = (
    """CREATE TABLE checkpoints (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        checkpoint_id TEXT NOT NULL,
        parent_checkpoint_id TEXT,
        checkpoint BLOB NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    )""",
    """CREATE TABLE checkpoint_blobs (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        channel TEXT NOT NULL,
        version INTEGER NOT NULL,
        blob BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
    )""",
    """CREATE TABLE checkpoint_writes (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        blob BLOB NOT NULL,
        task_path TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    )""",
    # list(None) walks every thread newest first.
    "CREATE INDEX checkpoints_by_id ON checkpoints (checkpoint_id, thread_id, checkpoint_ns)",
)
"""Schema steps, applied in order; append new ones, never edit or reorder."""

PAGE_SIZE = 100
"""Checkpoints ``list`` reads per round of queries."""

_ROW = "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata"
_BLOBS_SQL = """
    SELECT json_extract(k.value, '$[0]'), b.channel, b.blob
    FROM json_each(?) AS k JOIN checkpoint_blobs AS b
      ON b.thread_id = json_extract(k.value, '$[1]')
     AND b.checkpoint_ns = json_extract(k.value, '$[2]')
     AND b.channel = json_extract(k.value, '$[3]')
     AND b.version = json_extract(k.value, '$[4]')"""
_VERSIONS_SQL = """
    SELECT version, blob FROM checkpoint_blobs
    WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ?"""
_WRITES_SQL = """
    SELECT json_extract(k.value, '$[0]'), w.task_id, w.idx, w.channel, w.blob, w.task_path
    FROM json_each(?) AS k JOIN checkpoint_writes AS w
      ON w.thread_id = json_extract(k.value, '$[1]')
     AND w.checkpoint_ns = json_extract(k.value, '$[2]')
     AND w.checkpoint_id = json_extract(k.value, '$[3]')"""
_Row = tuple[str, str, str, str | None, bytes, str]


class SqliteSaver(AsyncSaverMethods):
    """A ``CheckpointSaver`` storing threads in one SQLite database."""

    def __init__(self, conn: sqlite3.Connection, *, serde: Serde | None = None) -> None:
        self.conn = conn
        self.serde: Serde = serde if serde is not None else MsgpackSerde()
        self._lock = threading.Lock()
        self._is_setup = False

    @classmethod
    @contextmanager
    def from_conn_string(cls, path: str, *, serde: Serde | None = None) -> Iterator[SqliteSaver]:
        """Open ``path`` (a file, or ``":memory:"``) for the ``with`` block, then close it."""
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            yield cls(conn, serde=serde)
        finally:
            conn.close()

    def setup(self) -> None:
        """Apply the migrations this database lacks; runs by itself on first use."""
        with self._lock:
            self._setup()

    def get_tuple(self, config: Mapping[str, Any]) -> CheckpointTuple | None:
        """The checkpoint named by ``configurable.checkpoint_id``, else the thread's latest."""
        where, params = list_where(config, None, "?")
        sql = f"SELECT {_ROW} FROM checkpoints WHERE {where} ORDER BY checkpoint_id DESC LIMIT 1"
        found = self._read_page(sql, params)
        return found[0] if found else None

    def list(
        self,
        config: Mapping[str, Any] | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first; ``filter`` matches metadata keys, ``before`` a checkpoint id.

        ``config`` names the thread, optionally a namespace (without one: all of the
        thread's) and one checkpoint; ``None`` lists every thread and namespace.
        """
        where, params = list_where(config, before, "?", listing=True)
        filter_sql, filter_params, exact = _metadata_where(filter)
        where, params = where + filter_sql, params + filter_params
        order = "ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC"

        def read(size: int, after: builtins.list[Any]) -> builtins.list[CheckpointTuple]:
            keyset = " AND (checkpoint_id, thread_id, checkpoint_ns) < (?, ?, ?)" if after else ""
            sql = f"SELECT {_ROW} FROM checkpoints WHERE {where}{keyset} {order} LIMIT {size}"
            return self._read_page(sql, [*params, *after])

        yield from keyset_pages(read, filter=filter, exact=exact, limit=limit, page_size=PAGE_SIZE)

    def put(
        self,
        config: Mapping[str, Any],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """Store ``checkpoint`` as the child of ``config``'s checkpoint; return its config.

        Only channels in ``new_versions`` get a blob row; the others are read from the row
        written when their current version was.
        """
        thread_id, ns, parent_id = config_thread(config)
        blobs = blob_rows(self.serde, thread_id, ns, checkpoint, new_versions)
        row = (
            thread_id,
            ns,
            checkpoint.id,
            parent_id,
            dumps_checkpoint(self.serde, checkpoint),
            dumps_metadata(metadata),
        )
        with self._write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO checkpoint_blobs VALUES (?, ?, ?, ?, ?)", blobs
            )
            conn.execute(
                f"INSERT OR REPLACE INTO checkpoints ({_ROW}) VALUES (?, ?, ?, ?, ?, ?)", row
            )
        return checkpoint_config(thread_id, ns, checkpoint.id)

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes: regular slots keep the first value, special slots the last."""
        rows = write_rows(self.serde, config, writes, task_id, task_path)
        columns = "thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, blob, task_path"
        with self._write() as conn:
            for verb, keep in (("INSERT OR IGNORE", True), ("INSERT OR REPLACE", False)):
                batch = [r for r in rows if (r[4] >= 0) is keep]
                sql = f"{verb} INTO checkpoint_writes ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                conn.executemany(sql, batch)

    def delete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint and write of ``thread_id``, in every namespace."""
        with self._write() as conn:
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))

    def _setup(self) -> None:
        """Apply missing migrations (lock held); each runs in its own transaction."""
        if self._is_setup:
            return
        conn = self.conn
        is_file = any(row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main")
        if is_file and not conn.in_transaction:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS checkpoint_migrations (v INTEGER PRIMARY KEY)")
        for version, statement in enumerate(MIGRATIONS):
            with self._transaction():
                # Re-checked inside the write lock: another process may have migrated meanwhile.
                done = conn.execute("SELECT 1 FROM checkpoint_migrations WHERE v = ?", (version,))
                if done.fetchone() is None:
                    conn.execute(statement)
                    conn.execute("INSERT INTO checkpoint_migrations (v) VALUES (?)", (version,))
        self._is_setup = True

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (lock held); rolls back on any error."""
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._setup()
            with self._transaction() as conn:
                yield conn

    def _read_page(self, sql: str, params: Sequence[Any]) -> builtins.list[CheckpointTuple]:
        """Checkpoints selected by ``sql`` (columns ``_ROW``), with their blobs and writes."""
        with self._lock:
            self._setup()
            rows: builtins.list[_Row] = self.conn.execute(sql, params).fetchall()
            if not rows:
                return []
            # Versions are inside the record, so records are decoded here to find the blobs.
            checkpoints = [loads_checkpoint(self.serde, row[4]) for row in rows]
            blob_keys = [
                [i, row[0], row[1], ch, version]
                for i, (row, ckpt) in enumerate(zip(rows, checkpoints, strict=True))
                for ch, version in ckpt.channel_versions.items()
            ]
            write_keys = [[i, row[0], row[1], row[2]] for i, row in enumerate(rows)]
            found_blobs = self.conn.execute(_BLOBS_SQL, (json.dumps(blob_keys),)).fetchall()
            found_writes = self.conn.execute(_WRITES_SQL, (json.dumps(write_keys),)).fetchall()
        blobs: builtins.list[dict[str, bytes]] = [{} for _ in rows]
        for i, channel, blob in found_blobs:
            if blob is not None:
                blobs[i][channel] = blob
        writes: builtins.list[builtins.list[tuple[str, int, str, bytes, str]]] = [[] for _ in rows]
        for i, *write in found_writes:
            writes[i].append(tuple(write))
        chains = Chains(self.serde, self._versions)
        return [
            self._decode(row, ckpt, blobs[i], writes[i], chains)
            for i, (row, ckpt) in enumerate(zip(rows, checkpoints, strict=True))
        ]

    def _versions(
        self, thread_id: str, ns: str, channel: str, version: int
    ) -> dict[int, bytes | None]:
        """Every stored version of ``channel``: ``version``'s chain among them."""
        with self._lock:
            rows = self.conn.execute(_VERSIONS_SQL, (thread_id, ns, channel)).fetchall()
        return dict(rows)

    def _decode(
        self,
        row: _Row,
        checkpoint: Checkpoint,
        blobs: Mapping[str, bytes],
        writes: builtins.list[tuple[str, int, str, bytes, str]],
        chains: Chains,
    ) -> CheckpointTuple:
        thread_id, ns, checkpoint_id, parent_id, _, metadata = row
        versions = checkpoint.channel_versions
        values = {
            ch: chains.value(thread_id, ns, ch, versions[ch], blob) for ch, blob in blobs.items()
        }
        writes.sort(key=lambda w: writes_sort_key(w[4], w[0], w[1]))
        return CheckpointTuple(
            config=checkpoint_config(thread_id, ns, checkpoint_id),
            checkpoint=dataclasses.replace(checkpoint, channel_values=values),
            metadata=loads_metadata(metadata),
            parent_config=(
                checkpoint_config(thread_id, ns, parent_id) if parent_id is not None else None
            ),
            pending_writes=tuple(
                (task_id, ch, self.serde.loads(b)) for task_id, _, ch, b, _ in writes
            ),
        )


def _metadata_where(filter: Mapping[str, Any] | None) -> tuple[str, list[Any], bool]:
    """SQL for the ``filter`` items SQLite can match exactly, and whether that was all of them.

    Matches what ``metadata_matches`` does in Python: ``None`` also matches a missing key,
    numbers and bools compare by value, strings only equal strings. Other values (lists,
    dicts, keys SQLite's JSON paths cannot quote) are matched in Python after reading.
    """
    where, exact = "", True
    params: list[Any] = []
    for key, value in (filter or {}).items():
        path = f'$."{key}"'
        if '"' in key or "\\" in key:
            exact = False
        elif value is None:
            where += " AND json_extract(metadata, ?) IS NULL"
            params += [path]
        elif isinstance(value, str):
            where += " AND json_extract(metadata, ?) = ? AND json_type(metadata, ?) = 'text'"
            params += [path, value, path]
        elif isinstance(value, (bool, float)) or (
            isinstance(value, int) and -(2**63) <= value < 2**63
        ):
            where += " AND json_extract(metadata, ?) = ?"
            params += [path, value]
        else:
            exact = False
    return where, params, exact
