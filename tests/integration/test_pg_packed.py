"""Many regular writes in few Postgres rows (``bulksync.checkpoint.pg_packed``): what is
stored, what is read back, and which value a slot keeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bulksync.checkpoint.base import Checkpoint
from bulksync.checkpoint.memory import MemorySaver
from bulksync.checkpoint.pg_packed import PACK_MIN, PACKED
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.constants import ERROR, INTERRUPT, TASKS
from bulksync.coordinator.clock import checkpoint_id
from bulksync.types import Send

pytestmark = pytest.mark.integration

THREAD = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}


@pytest.fixture
def saver(pg_schema: str) -> Iterator[PostgresSaver]:
    with PostgresSaver.from_conn_string(pg_schema) as pg_saver:
        pg_saver.setup()
        yield pg_saver


def first_checkpoint(saver: Any) -> dict[str, Any]:
    ckpt = Checkpoint(4, checkpoint_id(0), "2024-01-01T00:00:00+00:00", {"a": 1}, {"a": 1}, {})
    config: dict[str, Any] = saver.put(THREAD, ckpt, {"step": 0}, {"a": 1})
    return config


def rows(saver: PostgresSaver, task_id: str) -> list[tuple[int, str]]:
    """(slot, channel) of each row ``task_id`` has."""
    with saver.pool.connection() as conn:
        found = conn.execute(
            "SELECT idx, channel FROM bulksync_checkpoint_writes WHERE task_id = %s ORDER BY idx",
            (task_id,),
        ).fetchall()
    return [(idx, channel) for idx, channel in found]


def pending(saver: Any, config: dict[str, Any], task_id: str) -> list[tuple[str, Any]]:
    found = saver.get_tuple(config)
    assert found is not None
    return [(ch, value) for task, ch, value in found.pending_writes if task == task_id]


def sends(n: int, tag: str = "") -> list[tuple[str, Any]]:
    return [(TASKS, Send("work", {"i": i, "tag": tag})) for i in range(n)]


def test_a_tasks_many_writes_are_one_row_and_read_back_in_order(saver: PostgresSaver) -> None:
    config = first_checkpoint(saver)
    writes = [(ERROR, "boom"), ("a", 1), *sends(PACK_MIN + 8), ("b", 2), (INTERRUPT, "stop")]
    saver.put_writes(config, writes, "fan", "path")
    assert [ch for _, ch in rows(saver, "fan")] == [INTERRUPT, ERROR, PACKED]
    # What a saver with a row per write reads back, in the same order.
    memory = MemorySaver()
    memory_config = first_checkpoint(memory)
    memory.put_writes(memory_config, writes, "fan", "path")
    assert pending(saver, config, "fan") == pending(memory, memory_config, "fan")
    assert [ch for ch, _ in pending(saver, config, "fan")][:3] == [INTERRUPT, ERROR, "a"]


def test_a_few_writes_keep_a_row_each(saver: PostgresSaver) -> None:
    config = first_checkpoint(saver)
    saver.put_writes(config, sends(PACK_MIN - 1), "few")
    assert len(rows(saver, "few")) == PACK_MIN - 1
    assert len(pending(saver, config, "few")) == PACK_MIN - 1


def test_a_packed_batch_and_its_checkpoint_are_read_as_stored(saver: PostgresSaver) -> None:
    config = first_checkpoint(saver)
    ckpt = Checkpoint(4, checkpoint_id(1), "2024-01-01T00:00:01+00:00", {"a": 2}, {"a": 2}, {})
    batch = [(sends(100, "x"), "route", "p1"), ([("a", 2)], "other", "p0")]
    saver.put_step(config, batch, ckpt, {"step": 1}, {"a": 2})
    found = saver.get_tuple(config)
    assert found is not None
    assert [t for t, _, _ in found.pending_writes] == ["other"] + ["route"] * 100
    assert [v.arg["i"] for _, ch, v in found.pending_writes if ch == TASKS] == list(range(100))
    listed = list(saver.list(THREAD))
    assert [len(t.pending_writes) for t in listed] == [0, 101]


def test_a_slot_keeps_its_first_value_across_calls(saver: PostgresSaver) -> None:
    config = first_checkpoint(saver)
    # Fewer first (a row each), then more (packed): the rows' values stay, the rest is added.
    saver.put_writes(config, sends(10, "first"), "grow")
    saver.put_writes(config, sends(50, "second"), "grow")
    got = [v.arg["tag"] for _, v in pending(saver, config, "grow")]
    assert got == ["first"] * 10 + ["second"] * 40
    # Packed, then packed with more: the first row's slots keep their values.
    saver.put_writes(config, sends(40, "first"), "longer")
    saver.put_writes(config, sends(60, "second"), "longer")
    got = [v.arg["tag"] for _, v in pending(saver, config, "longer")]
    assert got == ["first"] * 40 + ["second"] * 20
    # The same slots again: the first call's row stays whole.
    saver.put_writes(config, sends(40, "first"), "again")
    saver.put_writes(config, sends(40, "second"), "again")
    assert [v.arg["tag"] for _, v in pending(saver, config, "again")] == ["first"] * 40
    assert len(rows(saver, "again")) == 1


def test_many_tasks_few_writes_each_share_a_row(saver: PostgresSaver) -> None:
    config = first_checkpoint(saver)
    batch = [
        ([("out", i), (ERROR, f"e{i}")] if i == 7 else [("out", i)], f"t-{i:03}", f"p{i}")
        for i in range(100)
    ]
    saver.put_writes_batch(config, batch)
    saver.put_writes_batch(config, batch)  # a retried call: the same row, kept once
    with saver.pool.connection() as conn:
        found = conn.execute(
            "SELECT task_id, idx, channel FROM bulksync_checkpoint_writes"
        ).fetchall()
    shared = [r for r in found if r[2] == PACKED]
    assert len(shared) == 1 and [r[:2] for r in found if r[2] == ERROR] == [("t-007", -1)]
    memory = MemorySaver()
    memory_config = first_checkpoint(memory)
    for writes, task_id, path in batch:
        memory.put_writes(memory_config, writes, task_id, path)
    got, want = saver.get_tuple(config), memory.get_tuple(memory_config)
    assert got is not None and want is not None
    assert got.pending_writes == want.pending_writes
