"""What ``PostgresSaver`` sends to store checkpoints: a commit's rows, and the statements
that store one commit, or several in one transaction (its group commit).

A commit is queued on a cursor in pipeline mode, so all its statements go in one round trip
and run as one transaction. Fences come first: a lone commit's (``FENCE_SQL``) waits for its
lease row (a takeover in flight); several commits' (``FENCE_TOGETHER_SQL``) never wait.

Then one statement per step inserts its rows of every table — writes, channel values, its
checkpoint —, each table's as one multi-row ``INSERT`` in a ``WITH`` clause of it: a
statement per row cost the caller and Postgres a quarter more CPU per commit (a step of two
writes, three values and a checkpoint: 620 µs of the caller's and 450 of Postgres's, against
460 and 350). A statement per step rather than per transaction keeps the statements' shapes
few (a graph's steps repeat theirs), so their prepared statements serve again: one shape
per group commit was parsed and planned anew each time. A row an update may meet twice in
one statement is sent once, the last one, as a statement per row would have left it. Many
rows (a wide fan-out's writes) go ``ROWS_PER_STATEMENT`` at a time.

They are prepared on their first run (``prepare=True``), not after psycopg's five: psycopg
then takes a statement as prepared without reading the answer to its ``Parse``, which a
pipeline aborted at a refused fence never sends, and the connection's next run of it fails
(``InvalidSqlStatementName``). On a first run it reads that answer, as ``executemany`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final

import psycopg

from bulksync.checkpoint import pg_migrations as pgm

Queued = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], tuple[Any, ...]]
"""One step to store: its write rows, blob rows and checkpoint row."""


class Commit:
    """One ``put_steps`` call's commit, and what became of it in its round."""

    __slots__ = ("thread_id", "token", "queued", "what", "alone")

    def __init__(self, thread_id: str, token: int | None, queued: list[Queued], what: str) -> None:
        self.thread_id = thread_id
        self.token = token  # the lease's fencing token it needs; None: not fenced
        self.queued = queued
        self.what = what
        self.alone = False  # its round failed: to be sent again alone


ROWS_PER_STATEMENT: Final = 256
"""Rows one statement inserts at most (a write has 8 parameters; Postgres takes 65,535)."""

Insert = tuple[str, str, str]
"""An insert of ``pg_migrations``: the ``INSERT`` before its rows, a row's placeholders, what
a conflict does."""
Row = tuple[Any, ...]


def queue_commits(cur: psycopg.Cursor[Any], batch: Sequence[Commit]) -> None:
    """Queue the statements storing the commits of ``batch`` in one transaction: their
    fences, then a statement per step (its writes, channel values and checkpoint)."""
    fences = sorted({(e.thread_id, e.token) for e in batch if e.token is not None})
    if len(batch) == 1 and fences:
        cur.execute(pgm.FENCE_SQL, fences[0])
    elif fences:
        threads, tokens = zip(*fences, strict=True)
        cur.execute(pgm.FENCE_TOGETHER_SQL, (list(threads), list(tokens)))
    for entry in batch:
        for writes, blobs, checkpoint in entry.queued:
            queue_inserts(
                cur,
                [
                    *_writes(writes),
                    (pgm.PUT_BLOBS, _last_per_key(blobs, 4)),  # (thread, ns, channel, version)
                    (pgm.PUT_CHECKPOINTS, [checkpoint]),
                ],
            )


def queue_writes(cur: psycopg.Cursor[Any], rows: Sequence[Row]) -> None:
    """Queue the statements storing write ``rows``: regular slots keep the first value,
    special slots (negative) the last."""
    queue_inserts(cur, _writes(rows))


def queue_inserts(
    cur: psycopg.Cursor[Any], inserts: Sequence[tuple[Insert, Sequence[Row]]]
) -> None:
    """Queue the statements inserting each ``(insert, rows)``: one for them all while they
    hold ``ROWS_PER_STATEMENT`` rows at most, else one per ``ROWS_PER_STATEMENT`` rows."""
    pieces = [
        (insert, rows[i : i + ROWS_PER_STATEMENT])
        for insert, rows in inserts
        for i in range(0, len(rows), ROWS_PER_STATEMENT)
    ]
    if sum(len(rows) for _, rows in pieces) > ROWS_PER_STATEMENT:
        for insert, rows in pieces:
            cur.execute(
                _insert_sql(insert, len(rows)), [v for row in rows for v in row], prepare=True
            )
    elif pieces:
        *first, last = [_insert_sql(insert, len(rows)) for insert, rows in pieces]
        with_ = "".join(
            f"{'WITH' if i == 0 else ','} i{i} AS ({sql}) " for i, sql in enumerate(first)
        )
        params = [v for _, rows in pieces for row in rows for v in row]
        cur.execute(with_ + last, params, prepare=True)


def _writes(rows: Sequence[Row]) -> list[tuple[Insert, Sequence[Row]]]:
    """The inserts of write ``rows``: regular slots keep the first value, special slots
    (negative) the last."""
    last = [r for r in rows if r[4] < 0]
    return [
        (pgm.KEEP_FIRST, [r for r in rows if r[4] >= 0]),
        (pgm.KEEP_LAST, _last_per_key(last, 5)),  # (thread, ns, checkpoint, task, slot)
    ]


def _last_per_key(rows: Sequence[Row], width: int) -> Sequence[Row]:
    """``rows`` with the last of those sharing their first ``width`` columns only, in the
    place of the first: an ``INSERT`` may not update one row twice."""
    if len({row[:width] for row in rows}) == len(rows):
        return rows
    kept: dict[Row, Row] = {}
    for row in rows:
        kept[row[:width]] = row
    return list(kept.values())


@functools.lru_cache(maxsize=512)
def _insert_sql(insert: Insert, count: int) -> str:
    """The statement inserting ``count`` rows with ``insert``."""
    head, row, conflict = insert
    return f"{head} VALUES {', '.join([row] * count)} {conflict}"
