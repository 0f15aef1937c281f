"""How ``PostgresSaver`` stores many writes: the regular ones of a call in few rows.

A row costs Postgres about 14 µs to insert and index, and a transaction about 1 ms of CPU: a
node that returns a thousand ``Send`` objects made a thousand rows on the commit its fan-out
waits for, and the fan-out's thousand results a thousand more, on the cores the workers need.
So a call that stores many regular writes (``PACK_MIN`` or more) stores them as *packed*
rows: the channel column is ``PACKED``, the blob the writes (msgpack). Special writes
(negative slots, the last value kept) stay rows of their own, and so do the run's input
writes (``NULL_TASK_ID``), which the service counts by their rows. Reads unpack packed rows
into the writes they hold, so nothing above the saver sees them.

- A task with ``PACK_MIN`` or more regular writes in the call gets a row of its own, under its
  task id, at the slot ``PACKED_BASE`` plus the last slot it holds; its entries are ``[slot,
  channel, bytes]``.
- The other tasks' regular writes, when there are ``PACK_MIN`` or more of them in all, share
  one row under a task id made of ``PACKED_TASKS`` and a digest of the (task, slot) pairs it
  holds, at the slot ``PACKED_BASE``; its entries are ``[task id, slot, channel, bytes, task
  path]``. The same call repeated (a retried transaction) makes the same row, kept once.

Keeping the first value per slot holds as with a row per write, but for one case:

- A packed row's key never collides with a plain row's, so the writes of both are read. Two
  packed rows collide when they hold the same writes (a shared row) or end on the same slot
  (a task's own row); the first stays whole.
- A slot several rows hold (one task's writes stored twice, by calls of different lengths)
  keeps a plain row's value, else that of the packed row with the lowest slot. When the
  values differ that may not be the first one stored. Values differ only when one task's
  writes are stored twice from two runs of its node that gave different answers; the
  coordinator stores a task's writes once, and skips a task whose writes are stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgpack

from bulksync.constants import NULL_TASK_ID

PACKED: Final = "__bulksync_packed__"
"""The channel column of a packed row."""

PACK_MIN: Final = 32
"""Regular writes of one task, or of the call's other tasks together, are packed from this
many on."""

PACKED_BASE: Final = 1 << 30
"""The slot of a shared packed row, and added to the last slot a task's own packed row
holds: above any slot a list of writes can take, below the column's limit (2**31 - 1)."""

PACKED_TASKS: Final = "__bulksync_tasks__:"
"""How the task id of a row that packs the writes of several tasks begins."""

Row = tuple[Any, ...]
"""``(thread, ns, checkpoint id, task id, idx, channel, bytes, task path)``."""

Write = tuple[str, int, str, bytes, str]
"""``(task id, idx, channel, bytes, task path)``, as read."""


def packed(rows: Sequence[Row]) -> list[Row]:
    """The rows of one call (several tasks' writes, each task's by slot, as ``write_rows``
    gives them) with their regular writes packed where there are ``PACK_MIN`` or more of them
    (module docstring)."""
    regular = [r for r in rows if r[4] >= 0 and r[3] != NULL_TASK_ID]
    if len(regular) < PACK_MIN:
        return list(rows)
    out = [r for r in rows if r[4] < 0 or r[3] == NULL_TASK_ID]
    by_task: dict[str, list[Row]] = {}
    for r in regular:
        by_task.setdefault(r[3], []).append(r)
    shared: list[Row] = []
    for task_rows in by_task.values():
        last = max(r[4] for r in task_rows)  # (a task listed twice in a call: not in order)
        if len(task_rows) < PACK_MIN or last >= PACKED_BASE:
            shared.extend(task_rows)
            continue
        first = task_rows[0]
        entries = [[r[4], r[5], r[6]] for r in task_rows]
        out.append((*first[:4], PACKED_BASE + last, PACKED, _pack(entries), first[7]))
    if len(shared) < PACK_MIN:
        return [*out, *shared]
    digest = hashlib.blake2b(digest_size=16)
    for r in shared:
        digest.update(f"{r[3]}\x00{r[4]}\x00".encode())
    task_id = PACKED_TASKS + digest.hexdigest()
    entries = [[r[3], r[4], r[5], r[6], r[7]] for r in shared]
    out.append((*shared[0][:3], task_id, PACKED_BASE, PACKED, _pack(entries), ""))
    return out


def unpacked(writes: Iterable[Write]) -> list[Write]:
    """``writes`` as read, each packed row replaced by the writes it holds; a slot held by
    several rows keeps one value (module docstring)."""
    writes = list(writes)
    if not any(w[2] == PACKED for w in writes):
        return writes
    # (task, slot) -> (rank, write): a plain row ranks first, then packed rows by slot.
    kept: dict[tuple[str, int], tuple[int, Write]] = {}
    for task_id, idx, channel, blob, path in writes:
        if channel != PACKED:
            kept[(task_id, idx)] = (-1, (task_id, idx, channel, blob, path))
            continue
        for entry in msgpack.unpackb(blob, raw=False):
            write = (task_id, *entry, path) if len(entry) == 3 else tuple(entry)
            known = kept.get((write[0], write[1]))
            if known is None or idx < known[0]:
                kept[(write[0], write[1])] = (idx, write)
    return [write for _, write in kept.values()]


def _pack(entries: list[list[Any]]) -> bytes:
    data: bytes = msgpack.packb(entries, use_bin_type=True)
    return data
