"""LastValue and LastValueAfterFinish: one value per step; deferred release at finish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.channels.last_value import LastValue as LgLastValue
from langgraph.channels.last_value import LastValueAfterFinish as LgLastValueAfterFinish

from bulksync.channels import LastValue, LastValueAfterFinish
from bulksync.channels.base import MISSING
from bulksync.errors import EmptyChannelError, InvalidUpdateError

LAST_VALUE_CASES: dict[str, list[tuple[Any, ...]]] = {
    "one write": [("update", [1])],
    "writes in later steps replace": [("update", [1]), ("update", ["b"]), ("update", [None])],
    "empty step keeps value": [("update", [{"a": 1}]), ("update", []), ("restore",)],
    "restore and copy": [("update", [[1, 2]]), ("restore",), ("copy",), ("update", [3])],
    "stored": [("stored",), ("update", [(1, "a")]), ("stored",)],
    "two writes in a step": [("update", [1]), ("update", [2, 3])],
    "consume and finish do nothing": [("update", [1]), ("consume",), ("finish",)],
    "nothing written": [("update", []), ("restore",), ("consume",)],
}


@pytest.mark.parametrize("ops", LAST_VALUE_CASES.values(), ids=LAST_VALUE_CASES.keys())
def test_last_value_matches_langgraph(
    ops: list[tuple[Any, ...]], trace: Callable[..., Any]
) -> None:
    assert trace(LastValue(int, "k"), ops) == trace(LgLastValue(int, "k"), ops)


AFTER_FINISH_CASES: dict[str, list[tuple[Any, ...]]] = {
    "hidden until finish": [("update", ["x"]), ("finish",), ("finish",)],
    "consume after finish empties": [("update", ["x"]), ("finish",), ("consume",), ("consume",)],
    "consume before finish keeps": [("update", ["x"]), ("consume",), ("finish",)],
    "write after finish hides again": [("update", ["x"]), ("finish",), ("update", ["y"])],
    "several writes keep the last": [("update", ["a", "b", "c"]), ("finish",)],
    "restore keeps finished flag": [("update", ["x"]), ("finish",), ("restore",), ("consume",)],
    "restore before finish": [("update", ["x"]), ("restore",), ("copy",), ("finish",)],
    "stored": [("update", [("x",)]), ("stored",), ("finish",), ("stored",), ("consume",)],
    "finish with nothing": [("finish",), ("update", []), ("consume",)],
}


@pytest.mark.parametrize("ops", AFTER_FINISH_CASES.values(), ids=AFTER_FINISH_CASES.keys())
def test_after_finish_matches_langgraph(
    ops: list[tuple[Any, ...]], trace: Callable[..., Any]
) -> None:
    lg: Any = LgLastValueAfterFinish(str)
    lg.key = "k"
    assert trace(LastValueAfterFinish(str, "k"), ops) == trace(lg, ops)


def test_two_writes_raise_the_langgraph_message_naming_the_key() -> None:
    channel: LastValue[int] = LastValue(int, "answer")
    with pytest.raises(InvalidUpdateError) as caught:
        channel.update([1, 2])
    assert str(caught.value) == (
        "At key 'answer': Can receive only one value per step. "
        "Use an Annotated key to handle multiple values."
    )
    lg: Any = LgLastValue(int, "answer")
    with pytest.raises(Exception) as lg_caught:
        lg.update([1, 2])
    assert str(lg_caught.value).splitlines()[0] == str(caught.value)
    assert isinstance(caught.value, ValueError)  # LangGraph's InvalidUpdateError base


def test_two_writes_leave_the_old_value() -> None:
    channel: LastValue[int] = LastValue(int, "k")
    channel.update([1])
    with pytest.raises(InvalidUpdateError):
        channel.update([2, 3])
    assert channel.get() == 1


def test_empty_channel_raises_on_get() -> None:
    with pytest.raises(EmptyChannelError):
        LastValue(int, "k").get()
    with pytest.raises(EmptyChannelError):
        LastValueAfterFinish(int, "k").get()


@pytest.mark.parametrize("value", [None, 0, "", [], False])
def test_falsy_values_are_values(value: Any) -> None:
    channel: LastValue[Any] = LastValue(Any, "k")
    assert channel.update([value]) is True
    assert channel.is_available()
    assert channel.get() == value
    assert channel.from_checkpoint(channel.checkpoint()).get() == value


@pytest.mark.parametrize("cls", [LastValue, LastValueAfterFinish])
def test_from_checkpoint_keeps_key_and_type_and_leaves_template(cls: type[Any]) -> None:
    template = cls(list[int], "items")
    live = template.from_checkpoint(MISSING)
    assert (type(live), live.key, live.typ) == (cls, "items", list[int])
    live.update([[1]])
    live.finish()
    restored = template.from_checkpoint(live.checkpoint())
    assert (restored.key, restored.typ, restored.get()) == ("items", list[int], [1])
    assert live is not template and template.checkpoint() is MISSING


def test_after_finish_restores_from_list_shaped_checkpoint() -> None:
    # msgpack gives back a list where a tuple was stored.
    template: LastValueAfterFinish[str] = LastValueAfterFinish(str, "k")
    live = template.from_checkpoint(["x", True])
    assert live.get() == "x"
    assert template.from_checkpoint(["x", False]).is_available() is False


@pytest.mark.parametrize("finished", [False, True])
def test_checkpoints_are_plain_data(finished: bool, is_plain: Callable[..., bool]) -> None:
    plain: LastValue[Any] = LastValue(Any, "k")
    plain.update([{"a": [1, 2]}])
    deferred: LastValueAfterFinish[Any] = LastValueAfterFinish(Any, "k")
    deferred.update([("t", 1)])
    if finished:
        deferred.finish()
    assert is_plain(plain.checkpoint()) and is_plain(deferred.checkpoint())
    assert deferred.checkpoint() == (("t", 1), finished)


def test_channels_compare_by_spec_like_langgraph() -> None:
    a: LastValue[int] = LastValue(int, "a")
    b: LastValue[str] = LastValue(str, "b")
    b.update(["x"])
    assert a == b
    assert a != LastValueAfterFinish(int, "a")
    assert (LgLastValue(int) == LgLastValue(str)) is (a == b)
