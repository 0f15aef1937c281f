"""What ``PostgresSaver`` reads: a page of checkpoints, with their channel values and writes.

A page is one query for its checkpoint rows, then one pipelined round trip for the blobs
their channel versions name and the writes stored against them — never a query per
checkpoint. The blobs read include, for a list stored as deltas (``appends.py``), the
versions down to its last whole value, so a linear thread's chains cost no further query;
a chain that reaches further is followed by the saver's ``versions`` (``pgm.CHAIN_SQL``).

Rows are read in Postgres's binary format (:func:`reading`): a ``bytea`` comes as its bytes
rather than as hex text of twice their size. The connection goes back to the pool before
the page is decoded, as decoding may read a chain on a connection of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from bulksync.checkpoint import pg_migrations as pgm
from bulksync.checkpoint.appends import Chains, Fetch, Stored
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointTuple,
    Serde,
    checkpoint_config,
    writes_sort_key,
)
from bulksync.checkpoint.pg_packed import Write, unpacked
from bulksync.checkpoint.serde import loads_checkpoint

Row = tuple[str, str, str, str | None, bytes, dict[str, Any]]
"""A checkpoint row as ``pgm.ROW_COLUMNS`` selects it."""


def read_page(
    connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
    serde: Serde,
    versions: Fetch,
    sql: str,
    params: Sequence[Any],
) -> list[CheckpointTuple]:
    """The checkpoints ``sql`` selects (``pgm.ROW_COLUMNS``), with their blobs and writes,
    read on a connection from ``connection()``; ``versions`` follows a longer chain."""
    with connection() as conn:
        rows: list[Row] = reading(conn).execute(sql, params).fetchall()
        if not rows:
            return []
        # Versions are inside the record, so records are decoded here to find the blobs.
        checkpoints = [loads_checkpoint(serde, row[4]) for row in rows]
        blob_keys = sorted(
            {
                (row[0], row[1], ch, version)
                for row, ckpt in zip(rows, checkpoints, strict=True)
                for ch, version in ckpt.channel_versions.items()
            }
        )
        write_keys = [(i, row[0], row[1], row[2]) for i, row in enumerate(rows)]
        with conn.pipeline():
            blob_cur = reading(conn).execute(pgm.BLOBS_SQL, _columns(blob_keys, 4))
            write_cur = reading(conn).execute(pgm.WRITES_SQL, _columns(write_keys, 4))
        found_blobs, found_writes = blob_cur.fetchall(), write_cur.fetchall()
    stored: Stored = {}
    for thread_id, ns, channel, version, blob in found_blobs:
        stored.setdefault((thread_id, ns, channel), {})[version] = blob
    writes: list[list[Write]] = [[] for _ in rows]
    for i, *write in found_writes:
        writes[i].append((write[0], write[1], write[2], write[3], write[4]))
    chains = Chains(serde, versions, stored)
    return [
        _decode(serde, row, ckpt, writes[i], chains)
        for i, (row, ckpt) in enumerate(zip(rows, checkpoints, strict=True))
    ]


def _decode(
    serde: Serde, row: Row, checkpoint: Checkpoint, writes: list[Write], chains: Chains
) -> CheckpointTuple:
    """The tuple of one checkpoint read; channels whose row holds no value are empty."""
    thread_id, ns, checkpoint_id, parent_id, _, metadata = row
    values = {}
    for ch, version in checkpoint.channel_versions.items():
        blob = chains.stored(thread_id, ns, ch, version)
        if blob is not None:
            values[ch] = chains.value(thread_id, ns, ch, version, blob)
    writes = unpacked(writes)
    writes.sort(key=lambda w: writes_sort_key(w[4], w[0], w[1]))
    return CheckpointTuple(
        config=checkpoint_config(thread_id, ns, checkpoint_id),
        checkpoint=dataclasses.replace(checkpoint, channel_values=values),
        metadata=metadata,
        parent_config=(
            checkpoint_config(thread_id, ns, parent_id) if parent_id is not None else None
        ),
        pending_writes=tuple((task_id, ch, serde.loads(b)) for task_id, _, ch, b, _ in writes),
    )


def _columns(keys: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows of keys as ``width`` column arrays, for ``unnest``."""
    return [list(column) for column in zip(*keys, strict=True)] if keys else [[]] * width


def reading(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A cursor for reading stored checkpoints: tuples, in Postgres's binary format, so that
    a ``bytea`` comes as its bytes rather than as hex text of twice their size (a long
    thread's chain of deltas is tens of kilobytes a read)."""
    return conn.cursor(row_factory=tuple_row, binary=True)
