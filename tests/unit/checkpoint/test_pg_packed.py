"""Packed write rows (``bulksync.checkpoint.pg_packed``): which writes share a row, and
which value a slot keeps when read.

What Postgres stores and reads back is in ``tests/integration/test_pg_packed.py``."""

from __future__ import annotations

import msgpack

from bulksync.checkpoint.pg_packed import (
    PACK_MIN,
    PACKED,
    PACKED_BASE,
    PACKED_TASKS,
    Write,
    packed,
    unpacked,
)
from bulksync.constants import NULL_TASK_ID


def packed_row(task: str, slots: range, tag: bytes) -> Write:
    blob = msgpack.packb([[s, "c", tag] for s in slots], use_bin_type=True)
    return (task, PACKED_BASE + slots[-1], PACKED, blob, "")


def test_unpacked_ranks_a_plain_row_first_then_the_packed_row_ending_first() -> None:
    plain: list[Write] = [("t", 1, "c", b"plain", "")]
    writes = [packed_row("t", range(6), b"long"), packed_row("t", range(4), b"short"), *plain]
    got = sorted((idx, data) for _, idx, _, data, _ in unpacked(writes))
    assert got == [
        (0, b"short"),
        (1, b"plain"),
        (2, b"short"),
        (3, b"short"),
        (4, b"long"),
        (5, b"long"),
    ]
    assert unpacked(plain) == plain


def test_each_task_keeps_its_own_slots() -> None:
    writes = [packed_row("a", range(3), b"a"), packed_row("b", range(2), b"b")]
    got = sorted((task, idx, data) for task, idx, _, data, _ in unpacked(writes))
    assert got == [("a", 0, b"a"), ("a", 1, b"a"), ("a", 2, b"a"), ("b", 0, b"b"), ("b", 1, b"b")]


def rows(task: str, slots: list[int]) -> list[tuple[object, ...]]:
    return [("t", "", "c1", task, s, "ch", b"x", "p") for s in slots]


def test_a_tasks_own_row_keeps_its_special_rows_apart() -> None:
    few = rows("task", [-2, *range(PACK_MIN - 1)])
    assert packed(few) == few
    many = packed(rows("task", [-2, -1, *range(40)]))
    assert [r[4] for r in many] == [-2, -1, PACKED_BASE + 39]
    assert [(r[3], r[5], r[7]) for r in many[2:]] == [("task", PACKED, "p")]


def test_tasks_with_few_writes_share_a_row_the_input_keeps_its_own() -> None:
    call = [r for i in range(40) for r in rows(f"task-{i:02}", [-1, 0])]
    call += rows(NULL_TASK_ID, list(range(40)))
    out = packed(call)
    shared = [r for r in out if str(r[3]).startswith(PACKED_TASKS)]
    assert len(shared) == 1 and shared[0][4:6] == (PACKED_BASE, PACKED)
    assert sorted(r[3] for r in out if r[4] == -1) == [f"task-{i:02}" for i in range(40)]
    assert [r[4] for r in out if r[3] == NULL_TASK_ID] == list(range(40))  # counted by rows
    # The same call again makes the same row (a retried transaction stores it once).
    assert packed(call)[-1][3] == shared[0][3]
    assert packed(call[:-41])[-1][3] != shared[0][3]
    read = unpacked([(str(r[3]), int(r[4]), str(r[5]), bytes(r[6]), str(r[7])) for r in shared])
    assert sorted(read) == [(f"task-{i:02}", 0, "ch", b"x", "p") for i in range(40)]


def test_slots_beyond_a_tasks_own_row_go_to_the_shared_one() -> None:
    beyond = rows("task", list(range(PACKED_BASE, PACKED_BASE + 40)))
    (row,) = packed(beyond)
    assert str(row[3]).startswith(PACKED_TASKS)
