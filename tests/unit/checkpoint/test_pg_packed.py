"""Reading packed write rows (``bulksync.checkpoint.pg_packed``): which value a slot keeps.

What Postgres stores and reads back is in ``tests/integration/test_pg_packed.py``."""

from __future__ import annotations

import msgpack

from bulksync.checkpoint.pg_packed import PACKED, PACKED_BASE, Write, packed, unpacked


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


def test_packing_keeps_special_rows_and_what_it_cannot_pack() -> None:
    def rows(slots: list[int]) -> list[tuple[object, ...]]:
        return [("t", "", "c1", "task", s, "ch", b"x", "p") for s in slots]

    few = rows([-2, *range(31)])
    assert packed(few) == few
    many = packed(rows([-2, -1, *range(40)]))
    assert [r[4] for r in many] == [-2, -1, PACKED_BASE + 39]
    assert [(r[3], r[5], r[7]) for r in many[2:]] == [("task", PACKED, "p")]
    beyond = rows(list(range(PACKED_BASE, PACKED_BASE + 40)))  # no room above the last slot
    assert packed(beyond) == beyond
