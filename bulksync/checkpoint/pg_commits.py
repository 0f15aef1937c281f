"""What ``PostgresSaver`` sends to store checkpoints: a commit's rows, and the statements
that store one commit, or several in one transaction (its group commit).

A commit is queued on a cursor in pipeline mode, so all its statements go in one round trip
and run as one transaction. Fences come first: a lone commit's (``FENCE_SQL``) waits for its
lease row (a takeover in flight); several commits' (``FENCE_TOGETHER_SQL``) never wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def queue_commits(cur: psycopg.Cursor[Any], batch: Sequence[Commit]) -> None:
    """Queue the statements storing the commits of ``batch`` in one transaction: their
    fences, then their writes, blobs and checkpoints."""
    fences = sorted({(e.thread_id, e.token) for e in batch if e.token is not None})
    if len(batch) == 1 and fences:
        cur.execute(pgm.FENCE_SQL, fences[0])
    elif fences:
        threads, tokens = zip(*fences, strict=True)
        cur.execute(pgm.FENCE_TOGETHER_SQL, (list(threads), list(tokens)))
    queued = [step for entry in batch for step in entry.queued]
    queue_writes(cur, [r for rows, _, _ in queued for r in rows])
    cur.executemany(pgm.PUT_BLOB_SQL, [b for _, blobs, _ in queued for b in blobs])
    cur.executemany(pgm.PUT_CHECKPOINT_SQL, [row for _, _, row in queued])


def queue_writes(cur: psycopg.Cursor[Any], rows: Sequence[tuple[Any, ...]]) -> None:
    """Queue the statements storing write ``rows``: regular slots keep the first value,
    special slots (negative) the last."""
    for sql, keep in ((pgm.KEEP_FIRST_SQL, True), (pgm.KEEP_LAST_SQL, False)):
        chosen = [r for r in rows if (r[4] >= 0) is keep]
        if chosen:
            cur.executemany(sql, chosen)
