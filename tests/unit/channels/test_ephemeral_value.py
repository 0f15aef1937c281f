"""EphemeralValue: a value for one step, cleared by a step that writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.channels.ephemeral_value import EphemeralValue as LgEphemeralValue

from bulksync.channels import EphemeralValue
from bulksync.channels.base import MISSING
from bulksync.errors import EmptyChannelError, InvalidUpdateError

CASES: dict[str, list[tuple[Any, ...]]] = {
    "lives one step": [("update", ["x"]), ("update", []), ("update", [])],
    "replaced next step": [("update", ["x"]), ("update", ["y"])],
    "None is a value": [("update", [None]), ("restore",), ("update", [])],
    "several writes": [("update", ["a", "b"]), ("update", [])],
    "restore and copy": [("update", [{"k": 1}]), ("restore",), ("copy",), ("update", [])],
    "stored": [("update", [("t", {1})]), ("stored",), ("update", [])],
    "consume and finish do nothing": [("update", [1]), ("consume",), ("finish",)],
}


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
@pytest.mark.parametrize("ops", CASES.values(), ids=CASES.keys())
def test_matches_langgraph(
    ops: list[tuple[Any, ...]], guard: bool, trace: Callable[..., Any]
) -> None:
    lg: Any = LgEphemeralValue(Any, guard)
    lg.key = "k"
    assert trace(EphemeralValue(Any, guard, key="k"), ops) == trace(lg, ops)


def test_update_results() -> None:
    channel: EphemeralValue[str] = EphemeralValue(str)
    assert channel.update([]) is False  # nothing to clear
    assert channel.update(["x"]) is True
    assert channel.update([]) is True  # cleared
    with pytest.raises(EmptyChannelError):
        channel.get()


def test_guard_names_the_key() -> None:
    channel: EphemeralValue[None] = EphemeralValue(None, key="branch:to:b")
    with pytest.raises(InvalidUpdateError, match=r"At key 'branch:to:b'.*guard=False"):
        channel.update([None, None])


def test_without_guard_last_write_wins() -> None:
    channel: EphemeralValue[str] = EphemeralValue(str, guard=False)
    channel.update(["a", "b", "c"])
    assert channel.get() == "c"


def test_from_checkpoint_keeps_spec_and_leaves_template() -> None:
    template: EphemeralValue[Any] = EphemeralValue(dict, guard=False, key="__start__")
    live = template.from_checkpoint({"q": 1})
    assert (live.key, live.typ, live.guard, live.get()) == ("__start__", dict, False, {"q": 1})
    assert template.checkpoint() is MISSING
    assert template.from_checkpoint(MISSING).is_available() is False


def test_checkpoint_is_plain_data(is_plain: Callable[..., bool]) -> None:
    channel: EphemeralValue[Any] = EphemeralValue(Any)
    assert is_plain(channel.checkpoint())
    channel.update([{"messages": [("user", "hi")]}])
    assert is_plain(channel.checkpoint())


def test_compares_by_guard_like_langgraph() -> None:
    assert EphemeralValue(int) == EphemeralValue(str)
    assert EphemeralValue(int) != EphemeralValue(int, guard=False)
    assert (LgEphemeralValue(int) == LgEphemeralValue(int, guard=False)) is False
