"""How ``PostgresSaver`` stores a task's many writes: its regular ones in one row.

A node that returns a thousand ``Send`` objects records a thousand regular writes, and a row
each cost Postgres about 14 µs to insert and index, on the commit a fan-out waits for before
it starts. So a call that stores ``PACK_MIN`` or more regular writes of one task stores them
as one *packed* row: its channel is ``PACKED``, its blob the writes' slots, channels and bytes
(msgpack), and its slot ``PACKED_BASE`` plus the last slot it holds. Special writes (negative
slots, the last value kept) stay rows of their own. Reads unpack such a row into the writes
it holds, so nothing above the saver sees it.

Keeping the first value per slot holds as with a row per write, but for one case:

- A packed row's slot lies above any a plain row can have, so the two never collide and the
  writes of both are read. Two packed rows of one task collide when they end on the same
  slot; the first stays whole.
- A slot several rows hold (one task's writes stored twice, by calls of different lengths)
  keeps a plain row's value, else that of the packed row ending first. When the values differ
  that may not be the first one stored: a plain row stored after a packed one wins. Values
  differ only when one task's writes are stored twice from two runs of its node that gave
  different answers; the coordinator stores a task's writes once, and skips a task whose
  writes are stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgpack

PACKED: Final = "__bulksync_packed__"
"""The channel column of a packed row."""

PACK_MIN: Final = 32
"""A call's regular writes of one task are packed from this many on."""

PACKED_BASE: Final = 1 << 30
"""Added to a packed row's last slot: above any slot a list of writes can take, below the
column's limit (2**31 - 1)."""

Row = tuple[Any, ...]
"""``(thread, ns, checkpoint id, task id, idx, channel, bytes, task path)``."""

Write = tuple[str, int, str, bytes, str]
"""``(task id, idx, channel, bytes, task path)``, as read."""


def packed(rows: Sequence[Row]) -> list[Row]:
    """``rows`` (one task's, from one call) with its regular ones in one packed row when
    there are ``PACK_MIN`` or more of them."""
    regular = [r for r in rows if r[4] >= 0]
    if len(regular) < PACK_MIN or regular[-1][4] >= PACKED_BASE:
        return list(rows)
    blob = msgpack.packb([[r[4], r[5], r[6]] for r in regular], use_bin_type=True)
    first = regular[0]
    one = (*first[:4], PACKED_BASE + max(r[4] for r in regular), PACKED, blob, first[7])
    return [*(r for r in rows if r[4] < 0), one]


def unpacked(writes: Iterable[Write]) -> list[Write]:
    """``writes`` as read, each packed row replaced by the writes it holds; a slot held by
    several rows keeps one value (module docstring)."""
    writes = list(writes)
    if not any(w[2] == PACKED for w in writes):
        return writes
    # (task, slot) -> (rank, write): a plain row ranks first, then packed rows by last slot.
    kept: dict[tuple[str, int], tuple[int, Write]] = {}
    for task_id, idx, channel, blob, path in writes:
        if channel != PACKED:
            kept[(task_id, idx)] = (-1, (task_id, idx, channel, blob, path))
            continue
        for slot, ch, data in msgpack.unpackb(blob, raw=False):
            known = kept.get((task_id, slot))
            if known is None or idx < known[0]:
                kept[(task_id, slot)] = (idx, (task_id, slot, ch, data, path))
    return [write for _, write in kept.values()]
