"""NamedBarrierValue(+AfterFinish): opens once every named writer wrote; consume closes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.channels.named_barrier_value import NamedBarrierValue as LgBarrier
from langgraph.channels.named_barrier_value import (
    NamedBarrierValueAfterFinish as LgBarrierAfterFinish,
)

from bulksync.channels import NamedBarrierValue, NamedBarrierValueAfterFinish
from bulksync.channels.base import MISSING
from bulksync.errors import EmptyChannelError, InvalidUpdateError

NAMES = {"a", "b"}

CASES: dict[str, list[tuple[Any, ...]]] = {
    "both in one step": [("update", ["a", "b"]), ("finish",), ("consume",), ("consume",)],
    "across steps": [("update", ["a"]), ("update", []), ("update", ["b"]), ("finish",)],
    "repeat names": [("update", ["a", "a"]), ("update", ["a"]), ("update", ["b", "b"])],
    "consume before open": [("update", ["a"]), ("consume",), ("finish",)],
    "consume before finish": [("update", ["a", "b"]), ("consume",), ("finish",), ("consume",)],
    "restore halfway": [("update", ["a"]), ("restore",), ("update", ["b"]), ("copy",)],
    "restore finished": [("update", ["a", "b"]), ("finish",), ("restore",), ("consume",)],
    "stored": [("update", ["a"]), ("stored",), ("update", ["b"]), ("finish",), ("stored",)],
    "reopen after consume": [
        ("update", ["a", "b"]),
        ("finish",),
        ("consume",),
        ("update", ["b", "a"]),
        ("finish",),
    ],
    "unknown name": [("update", ["a"]), ("update", ["c"])],
}

PAIRS = {
    "barrier": (NamedBarrierValue, LgBarrier),
    "after-finish": (NamedBarrierValueAfterFinish, LgBarrierAfterFinish),
}


@pytest.mark.parametrize(("ours", "theirs"), PAIRS.values(), ids=PAIRS.keys())
@pytest.mark.parametrize("ops", CASES.values(), ids=CASES.keys())
def test_matches_langgraph(
    ops: list[tuple[Any, ...]], ours: type[Any], theirs: type[Any], trace: Callable[..., Any]
) -> None:
    lg = theirs(str, set(NAMES))
    lg.key = "join:a+b:c"
    assert trace(ours(str, NAMES, key="join:a+b:c"), ops) == trace(lg, ops)


@pytest.mark.parametrize("cls", [NamedBarrierValue, NamedBarrierValueAfterFinish])
def test_unknown_name_names_key_and_value(cls: type[Any]) -> None:
    channel = cls(str, ["a", "b"], key="join:a+b:c")
    with pytest.raises(InvalidUpdateError) as caught:
        channel.update(["a", "intruder"])
    message = str(caught.value)
    assert "At key 'join:a+b:c'" in message
    assert "'intruder'" in message
    assert "{'a', 'b'}" in message


def test_barrier_opens_only_when_all_seen() -> None:
    channel: NamedBarrierValue[str] = NamedBarrierValue(str, ["a", "b", "c"])
    assert channel.update(["a"]) is True
    assert channel.update(["a"]) is False
    with pytest.raises(EmptyChannelError):
        channel.get()
    assert channel.update(["c", "b"]) is True
    assert channel.is_available()
    channel.get()  # returns None once open, raises while closed
    assert channel.consume() is True
    assert channel.is_available() is False and channel.checkpoint() == set()


def test_after_finish_opens_only_at_finish() -> None:
    channel: NamedBarrierValueAfterFinish[str] = NamedBarrierValueAfterFinish(str, ["a"])
    assert channel.finish() is False  # nothing seen yet
    channel.update(["a"])
    assert channel.is_available() is False
    assert channel.finish() is True
    assert channel.finish() is False
    assert channel.is_available()
    channel.get()  # returns None once open, raises while closed
    assert channel.consume() is True
    assert channel.checkpoint() == (set(), False)


@pytest.mark.parametrize("cls", [NamedBarrierValue, NamedBarrierValueAfterFinish])
def test_from_checkpoint_keeps_spec_and_leaves_template(cls: type[Any]) -> None:
    template = cls(str, {"a", "b"}, key="join")
    live = template.from_checkpoint(MISSING)
    live.update(["a"])
    restored = template.from_checkpoint(live.checkpoint())
    restored.update(["b"])
    assert (restored.key, restored.typ, set(restored.names)) == ("join", str, {"a", "b"})
    assert restored.is_available() is (cls is NamedBarrierValue)
    empty: Any = set() if cls is NamedBarrierValue else (set(), False)
    assert template.checkpoint() == empty
    seen_by_live = live.checkpoint() if cls is NamedBarrierValue else live.checkpoint()[0]
    assert seen_by_live == {"a"}


def test_stored_set_is_not_shared_with_the_live_barrier() -> None:
    stored = {"a"}
    live = NamedBarrierValue(str, {"a", "b"}).from_checkpoint(stored)
    live.update(["b"])
    assert stored == {"a"}
    snapshot = live.checkpoint()
    live.consume()
    assert snapshot == {"a", "b"}


def test_restores_from_msgpack_shapes() -> None:
    # msgpack gives back lists where sets and tuples were stored.
    plain = NamedBarrierValue(str, {"a", "b"}).from_checkpoint(["a", "b"])
    assert plain.is_available()
    deferred = NamedBarrierValueAfterFinish(str, {"a"}).from_checkpoint([["a"], True])
    assert deferred.is_available()


def test_checkpoints_are_plain_data(is_plain: Callable[..., bool]) -> None:
    plain = NamedBarrierValue(str, {"a", "b"})
    deferred = NamedBarrierValueAfterFinish(str, {"a", "b"})
    for channel in (plain, deferred):
        channel.update(["a"])
        assert is_plain(channel.checkpoint())


def test_compares_by_names_like_langgraph() -> None:
    assert NamedBarrierValue(str, ["a", "b"]) == NamedBarrierValue(str, {"b", "a"})
    assert NamedBarrierValue(str, ["a"]) != NamedBarrierValue(str, ["a", "b"])
    assert NamedBarrierValue(str, ["a"]) != NamedBarrierValueAfterFinish(str, ["a"])
