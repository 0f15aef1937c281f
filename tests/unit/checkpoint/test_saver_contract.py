"""The saver contract (checkpoint/base.py), run against every saver in conftest's ``SAVERS``."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest

from bulksync.checkpoint import sqlite as sqlite_module
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointSaver,
    Encoded,
    Serde,
    checkpoint_config,
)
from bulksync.checkpoint.serde import MsgpackSerde
from bulksync.checkpoint.sqlite import SqliteSaver
from bulksync.constants import ERROR, INTERRUPT, RESUME
from bulksync.coordinator.clock import checkpoint_id
from bulksync.errors import SerializationError, StoredError
from bulksync.types import Interrupt, Send


def thread(thread_id: str = "t1", ns: str = "") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}


def make_checkpoint(
    step: int,
    values: dict[str, Any],
    versions: dict[str, int],
    *,
    seen: dict[str, dict[str, int]] | None = None,
    updated: tuple[str, ...] | None = None,
) -> Checkpoint:
    return Checkpoint(
        v=4,
        id=checkpoint_id(step),
        ts=datetime.datetime.now(datetime.UTC).isoformat(),
        channel_values=values,
        channel_versions=versions,
        versions_seen=seen or {},
        updated_channels=updated,
    )


def put_chain(
    saver: CheckpointSaver, config: dict[str, Any], steps: int, **metadata: Any
) -> list[dict[str, Any]]:
    """Put ``steps`` checkpoints, each the child of the last; return their configs."""
    configs = []
    for step in range(steps):
        checkpoint = make_checkpoint(step, {"count": step}, {"count": step + 1})
        meta = {"source": "loop", "step": step, **metadata}
        config = saver.put(config, checkpoint, meta, {"count": step + 1})
        configs.append(config)
    return configs


def ids(tuples: Any) -> list[str]:
    return [t.checkpoint.id for t in tuples]


def test_put_returns_config_and_get_reads_latest_or_by_id(saver: CheckpointSaver) -> None:
    first = make_checkpoint(0, {"a": (1, 2), "b": "x"}, {"a": 1, "b": 1}, seen={"n": {"a": 1}})
    second = make_checkpoint(1, {"a": [3], "b": "x"}, {"a": 2, "b": 1}, updated=("a",))
    config1 = saver.put(thread(), first, {"step": 0}, {"a": 1, "b": 1})
    assert config1 == checkpoint_config("t1", "", first.id)
    config2 = saver.put(config1, second, {"step": 1}, {"a": 2})

    latest = saver.get_tuple(thread())
    assert latest is not None
    assert latest.config == config2
    assert latest.checkpoint == second
    assert latest.metadata == {"step": 1}

    by_id = saver.get_tuple(config1)
    assert by_id is not None
    assert by_id.checkpoint == first
    assert type(by_id.checkpoint.channel_values["a"]) is tuple


def test_get_tuple_of_unknown_thread_or_id_is_none(saver: CheckpointSaver) -> None:
    put_chain(saver, thread(), 1)
    assert saver.get_tuple(thread("other")) is None
    assert saver.get_tuple(checkpoint_config("t1", "", checkpoint_id(9))) is None


def test_parent_config_comes_from_the_config_passed_to_put(saver: CheckpointSaver) -> None:
    configs = put_chain(saver, thread(), 3)
    tuples = [saver.get_tuple(c) for c in configs]
    assert [t.parent_config if t else "missing" for t in tuples] == [None, *configs[:2]]


def test_checkpoint_without_thread_is_refused(saver: CheckpointSaver) -> None:
    with pytest.raises(ValueError, match="thread_id"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="thread_id"):
        saver.put({}, make_checkpoint(0, {}, {}), {}, {})


def test_list_is_newest_first_with_filter_before_and_limit(saver: CheckpointSaver) -> None:
    configs = put_chain(saver, thread(), 5)
    newest_first = [c["configurable"]["checkpoint_id"] for c in reversed(configs)]
    assert ids(saver.list(thread())) == newest_first
    assert ids(saver.list(thread(), limit=2)) == newest_first[:2]
    assert ids(saver.list(thread(), before=configs[3])) == newest_first[2:]
    assert ids(saver.list(thread(), before=configs[3], limit=1)) == newest_first[2:3]
    only_id = {"configurable": {"checkpoint_id": configs[1]["configurable"]["checkpoint_id"]}}
    assert ids(saver.list(thread(), before=only_id)) == newest_first[4:]
    assert ids(saver.list(thread(), filter={"step": 1})) == newest_first[3:4]
    assert ids(saver.list(thread(), filter={"source": "loop", "step": 9})) == []
    assert ids(saver.list(thread(), limit=0)) == []


def test_list_without_a_namespace_lists_the_threads_every_namespace(
    saver: CheckpointSaver,
) -> None:
    root = put_chain(saver, thread(), 2)
    sub = put_chain(saver, thread(ns="sub:1"), 3)
    put_chain(saver, thread("other"), 1)
    listed = list(saver.list({"configurable": {"thread_id": "t1"}}))
    assert sorted(ids(listed)) == sorted(c["configurable"]["checkpoint_id"] for c in root + sub)
    assert {t.config["configurable"]["checkpoint_ns"] for t in listed} == {"", "sub:1"}
    assert len(list(saver.list(thread()))) == 2  # a namespace named: that one only
    assert len(list(saver.list(thread(ns="sub:1")))) == 3
    # get_tuple without one reads the root namespace, as before.
    assert saver.get_tuple({"configurable": {"thread_id": "t1"}}).config == root[-1]  # type: ignore[union-attr]


def test_listed_tuples_equal_get_tuple(saver: CheckpointSaver) -> None:
    configs = put_chain(saver, thread(), 3)
    saver.put_writes(configs[1], [("count", 7)], "task")
    assert list(saver.list(thread())) == [saver.get_tuple(c) for c in reversed(configs)]


def test_list_none_covers_every_thread_and_namespace(saver: CheckpointSaver) -> None:
    put_chain(saver, thread("a"), 2)
    put_chain(saver, thread("b"), 2)
    put_chain(saver, thread("a", "child:1"), 1)
    listed = list(saver.list(None))
    assert len(listed) == 5
    assert ids(listed) == sorted(ids(listed), reverse=True)
    assert len(list(saver.list(None, filter={"step": 0}))) == 3
    assert len(list(saver.list(None, limit=4))) == 4


def test_list_with_checkpoint_id_returns_that_checkpoint(saver: CheckpointSaver) -> None:
    configs = put_chain(saver, thread(), 3)
    assert ids(saver.list(configs[1])) == [configs[1]["configurable"]["checkpoint_id"]]


def test_list_pages_through_many_checkpoints(
    saver: CheckpointSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "PAGE_SIZE", 4)
    configs = put_chain(saver, thread(), 11, parents={"": "root"})
    expected = [c["configurable"]["checkpoint_id"] for c in reversed(configs)]
    assert ids(saver.list(thread())) == expected
    assert ids(saver.list(thread(), limit=6)) == expected[:6]
    # A dict value is matched after reading, so paging must not cut the limit short.
    assert ids(saver.list(thread(), filter={"parents": {"": "root"}}, limit=9)) == expected[:9]
    assert ids(saver.list(thread(), filter={"parents": {"": "other"}})) == []


@pytest.mark.parametrize(
    ("filter", "matches"),
    [
        ({"flag": True}, ["bool", "one"]),
        ({"flag": 1}, ["bool", "one"]),
        ({"flag": 1.0}, ["bool", "one"]),
        ({"flag": "1"}, ["string"]),
        ({"flag": None}, ["null", "missing"]),
        ({"flag": {"x": 1}}, ["object"]),
        ({"flag": '{"x":1}'}, []),
        ({"flag": [1, 2]}, ["list"]),
        ({'odd"key': 1}, ["odd"]),
    ],
)
def test_metadata_filter_matches_by_value_like_python(
    saver: CheckpointSaver, filter: dict[str, Any], matches: list[str]
) -> None:
    flags: dict[str, Any] = {
        "bool": True,
        "one": 1,
        "string": "1",
        "null": None,
        "object": {"x": 1},
        "list": [1, 2],
    }
    for name, flag in flags.items():
        put_chain(saver, thread(name), 1, flag=flag)
    put_chain(saver, thread("missing"), 1)
    put_chain(saver, thread("odd"), 1, **{'odd"key': 1, "flag": 5})
    found = sorted(t.config["configurable"]["thread_id"] for t in saver.list(None, filter=filter))
    assert found == sorted(matches)


def test_namespaces_are_separate(saver: CheckpointSaver) -> None:
    root = put_chain(saver, thread(), 2)
    child = put_chain(saver, thread(ns="node:abc"), 1)
    saver.put_writes(child[0], [("count", "child")], "task")

    root_latest, child_latest = saver.get_tuple(thread()), saver.get_tuple(thread(ns="node:abc"))
    assert root_latest is not None and child_latest is not None
    assert root_latest.config == root[-1]
    assert child_latest.config == child[0]
    assert child_latest.pending_writes == (("task", "count", "child"),)
    assert root_latest.pending_writes == ()
    assert len(list(saver.list(thread()))) == 2
    assert len(list(saver.list(thread(ns="node:abc")))) == 1
    # The same channel and version in two namespaces are two values.
    assert child_latest.checkpoint.channel_values == {"count": 0}
    assert root_latest.checkpoint.channel_values == {"count": 1}


def pending(saver: CheckpointSaver, config: dict[str, Any]) -> tuple[Any, ...]:
    found = saver.get_tuple(config)
    assert found is not None
    return found.pending_writes


def test_regular_writes_first_write_wins(saver: CheckpointSaver) -> None:
    config = put_chain(saver, thread(), 1)[0]
    saver.put_writes(config, [("a", 1), ("b", 2)], "task")
    saver.put_writes(config, [("a", 9), ("b", 9), ("c", 3)], "task")
    assert pending(saver, config) == (("task", "a", 1), ("task", "b", 2), ("task", "c", 3))


def test_special_writes_replace(saver: CheckpointSaver) -> None:
    config = put_chain(saver, thread(), 1)[0]
    saver.put_writes(config, [(ERROR, ValueError("first"))], "task")
    saver.put_writes(config, [(ERROR, ValueError("second"))], "task")
    saver.put_writes(config, [(INTERRUPT, [Interrupt("q", "i1")]), (RESUME, ["a"])], "task")
    saver.put_writes(config, [(INTERRUPT, [Interrupt("q2", "i2")])], "task")
    writes = pending(saver, config)
    assert [(task, channel) for task, channel, _ in writes] == [
        ("task", RESUME),
        ("task", INTERRUPT),
        ("task", ERROR),
    ]
    by_channel = {channel: value for _, channel, value in writes}
    assert by_channel[ERROR] == StoredError("builtins.ValueError", "second", "ValueError('second')")
    assert by_channel[INTERRUPT] == [Interrupt("q2", "i2")]
    assert by_channel[RESUME] == ["a"]


def test_pending_writes_sorted_by_task_path_then_id_then_slot(saver: CheckpointSaver) -> None:
    config = put_chain(saver, thread(), 1)[0]
    saver.put_writes(config, [("x", "push-0"), (ERROR, "e")], "id-a", "~__pregel_push, 0")
    saver.put_writes(config, [("x", "pull-b"), ("y", "pull-b2")], "id-z", "~__pregel_pull, b")
    saver.put_writes(config, [("x", "pull-a")], "id-y", "~__pregel_pull, a")
    saver.put_writes(config, [("x", "null-2")], "id-2", "")
    saver.put_writes(config, [("x", "null-1")], "id-1", "")
    assert [value for _, _, value in pending(saver, config)] == [
        "null-1",
        "null-2",
        "pull-a",
        "pull-b",
        "pull-b2",
        "e",
        "push-0",
    ]


def test_writes_belong_to_their_checkpoint(saver: CheckpointSaver) -> None:
    first, second = put_chain(saver, thread(), 2)
    saver.put_writes(first, [("count", "old")], "task")
    assert pending(saver, second) == ()
    assert pending(saver, first) == (("task", "count", "old"),)


def test_put_writes_needs_a_checkpoint_id(saver: CheckpointSaver) -> None:
    with pytest.raises(ValueError, match="checkpoint_id"):
        saver.put_writes(thread(), [("a", 1)], "task")


def test_delete_thread_removes_every_namespace(saver: CheckpointSaver) -> None:
    kept = put_chain(saver, thread("keep"), 1)[0]
    saver.put_writes(kept, [("count", 1)], "task")
    for ns in ("", "child:1"):
        config = put_chain(saver, thread("gone", ns), 2)[-1]
        saver.put_writes(config, [("count", 1)], "task")
    saver.delete_thread("gone")
    assert saver.get_tuple(thread("gone")) is None
    assert saver.get_tuple(thread("gone", "child:1")) is None
    assert ids(saver.list(None)) == [kept["configurable"]["checkpoint_id"]]
    assert pending(saver, kept) == (("task", "count", 1),)
    # A thread started again under the same id starts empty.
    fresh = put_chain(saver, thread("gone"), 1)[0]
    assert pending(saver, fresh) == ()


class SpySerde:
    """Wraps a serde and records every value it encodes."""

    def __init__(self, inner: Serde) -> None:
        self.inner = inner
        self.dumped: list[Any] = []

    def dumps(self, value: Any) -> bytes:
        self.dumped.append(value)
        return self.inner.dumps(value)

    def loads(self, data: bytes) -> Any:
        return self.inner.loads(data)


def test_only_channels_in_new_versions_are_stored(
    saver: CheckpointSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = SpySerde(saver.serde)
    monkeypatch.setattr(saver, "serde", spy)
    first = make_checkpoint(0, {"big": ["x"] * 100, "small": 1}, {"big": 1, "small": 1})
    config = saver.put(thread(), first, {}, {"big": 1, "small": 1})
    rows_before = _blob_rows(saver)
    # "big" keeps version 1: its value is neither encoded nor stored again.
    second = make_checkpoint(1, {"big": ["unchanged"], "small": 2}, {"big": 1, "small": 2})
    saver.put(config, second, {}, {"small": 2})
    assert ["unchanged"] not in spy.dumped
    assert ["x"] * 100 in spy.dumped
    latest = saver.get_tuple(thread())
    assert latest is not None
    assert latest.checkpoint.channel_values == {"big": ["x"] * 100, "small": 2}
    if rows_before is not None:
        assert rows_before == 2
        assert _blob_rows(saver) == 3


def test_a_channel_version_put_again_reads_the_latest_value(saver: CheckpointSaver) -> None:
    # A fork from an old checkpoint reuses version numbers; the new branch must see its values.
    root = saver.put(thread(), make_checkpoint(0, {"a": "root"}, {"a": 1}), {}, {"a": 1})
    saver.put(root, make_checkpoint(1, {"a": "old branch"}, {"a": 2}), {}, {"a": 2})
    fork = saver.put(root, make_checkpoint(2, {"a": "fork"}, {"a": 2}), {}, {"a": 2})
    found = saver.get_tuple(fork)
    assert found is not None
    assert found.checkpoint.channel_values == {"a": "fork"}


def test_channel_emptied_by_a_step_reads_back_as_absent(saver: CheckpointSaver) -> None:
    first = make_checkpoint(0, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    config = saver.put(thread(), first, {}, {"a": 1, "b": 1})
    second = make_checkpoint(1, {"b": 1}, {"a": 2, "b": 1})
    saver.put(config, second, {}, {"a": 2})
    latest = saver.get_tuple(thread())
    assert latest is not None
    assert latest.checkpoint.channel_values == {"b": 1}
    earlier = saver.get_tuple(config)
    assert earlier is not None
    assert earlier.checkpoint.channel_values == {"a": 1, "b": 1}


def test_put_same_id_again_replaces_the_checkpoint(saver: CheckpointSaver) -> None:
    checkpoint = make_checkpoint(0, {"a": 1}, {"a": 1})
    saver.put(thread(), checkpoint, {"step": 0}, {"a": 1})
    saver.put(thread(), checkpoint, {"step": 5}, {"a": 1})
    assert [t.metadata for t in saver.list(thread())] == [{"step": 5}]


class Opaque:
    """No encoding registered."""


def test_unserializable_value_fails_and_stores_nothing(saver: CheckpointSaver) -> None:
    checkpoint = make_checkpoint(0, {"ok": 1, "bad": Opaque()}, {"ok": 1, "bad": 1})
    with pytest.raises(SerializationError, match="Opaque"):
        saver.put(thread(), checkpoint, {}, {"ok": 1, "bad": 1})
    assert saver.get_tuple(thread()) is None

    config = put_chain(saver, thread(), 1)[0]
    with pytest.raises(SerializationError, match="Opaque"):
        saver.put_writes(config, [("ok", 1), ("bad", Opaque())], "task")
    assert pending(saver, config) == ()


def test_unserializable_metadata_names_the_key(saver: CheckpointSaver) -> None:
    with pytest.raises(SerializationError, match="metadata key 'when'"):
        saver.put(thread(), make_checkpoint(0, {}, {}), {"when": Opaque()}, {})


def test_values_keep_their_types(saver: CheckpointSaver) -> None:
    value = {"sends": [Send("n", (1, 2))], 3: {frozenset({1}), (2,)}}
    config = saver.put(thread(), make_checkpoint(0, {"v": value}, {"v": 1}), {}, {"v": 1})
    saver.put_writes(config, [("v", value)], "task")
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint.channel_values["v"] == value
    assert found.pending_writes == (("task", "v", value),)


def test_returned_values_are_copies(saver: CheckpointSaver) -> None:
    config = saver.put(thread(), make_checkpoint(0, {"v": [1]}, {"v": 1}), {"m": [1]}, {"v": 1})
    found = saver.get_tuple(config)
    assert found is not None
    found.checkpoint.channel_values["v"].append(2)
    found.metadata["m"].append(2)
    again = saver.get_tuple(config)
    assert again is not None
    assert again.checkpoint.channel_values["v"] == [1]
    assert again.metadata["m"] == [1]


def test_concurrent_writers_on_one_saver(saver: CheckpointSaver) -> None:
    config = put_chain(saver, thread(), 1)[0]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                saver.put_writes(config, [("count", (n, i))], f"task-{n}-{i}")
                saver.get_tuple(config)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len(pending(saver, config)) == 120


# -- pre-encoded values (a worker's bytes stored as they are) ---------------------------


class ForeignSerde:
    """A serde of another format: its bytes are not the saver's, its values decode fine."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def dumps(self, value: Any) -> bytes:
        return b"foreign"

    def loads(self, data: bytes) -> Any:
        return self.value


VALUE: Any = {"sends": [Send("n", (1, 2))], "when": datetime.date(2024, 1, 2), "t": (1,)}


def test_pre_encoded_writes_read_back_as_their_values(saver: CheckpointSaver) -> None:
    config = put_chain(saver, thread(), 1)[0]
    wire_made = Encoded.of(MsgpackSerde(), VALUE)  # another instance, the same format
    saver.put_writes(config, [("a", wire_made), ("b", [1]), ("c", Encoded.of(saver.serde, 7))], "t")
    assert pending(saver, config) == (("t", "a", VALUE), ("t", "b", [1]), ("t", "c", 7))
    assert type(pending(saver, config)[0][2]["t"]) is tuple


def test_pre_encoded_and_plain_channel_values_mix(saver: CheckpointSaver) -> None:
    values = {"enc": Encoded.of(MsgpackSerde(), VALUE), "plain": ("x", 1)}
    versions = {"enc": 1, "plain": 1}
    config = saver.put(thread(), make_checkpoint(0, values, versions), {}, versions)
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint.channel_values == {"enc": VALUE, "plain": ("x", 1)}
    assert not any(isinstance(v, Encoded) for v in found.checkpoint.channel_values.values())


def test_bytes_in_the_savers_format_are_not_encoded_again(
    saver: CheckpointSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = SpySerde(saver.serde)
    monkeypatch.setattr(saver, "serde", spy)
    encoded = Encoded.of(spy, VALUE)
    spy.dumped.clear()
    config = saver.put(thread(), make_checkpoint(0, {"v": encoded}, {"v": 1}), {}, {"v": 1})
    saver.put_writes(config, [("v", encoded)], "task")
    assert VALUE not in spy.dumped
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint.channel_values["v"] == VALUE
    assert found.pending_writes == (("task", "v", VALUE),)


def test_bytes_of_another_format_are_encoded_from_the_value(saver: CheckpointSaver) -> None:
    foreign = Encoded(b"foreign", ForeignSerde(VALUE))
    config = saver.put(thread(), make_checkpoint(0, {"v": foreign}, {"v": 1}), {}, {"v": 1})
    saver.put_writes(config, [("v", foreign)], "task")
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint.channel_values["v"] == VALUE
    assert found.pending_writes == (("task", "v", VALUE),)


def test_saver_satisfies_the_protocol(saver: CheckpointSaver) -> None:
    assert isinstance(saver, CheckpointSaver)


def _blob_rows(saver: CheckpointSaver) -> int | None:
    """Stored blob rows, for savers whose storage a test can count (else ``None``)."""
    if isinstance(saver, SqliteSaver):
        count: int = saver.conn.execute("SELECT count(*) FROM checkpoint_blobs").fetchone()[0]
        return count
    return None
