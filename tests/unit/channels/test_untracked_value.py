"""UntrackedValue: kept in memory for a run, never checkpointed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.channels.untracked_value import UntrackedValue as LgUntrackedValue

from bulksync.channels import UntrackedValue
from bulksync.channels.base import MISSING
from bulksync.errors import InvalidUpdateError

CASES: dict[str, list[tuple[Any, ...]]] = {
    "one write": [("update", [1])],
    "empty step keeps": [("update", [1]), ("update", [])],
    "restore drops the value": [("update", [1]), ("restore",), ("update", [2])],
    "stored drops the value": [("update", [1]), ("stored",)],
    "copy keeps the value": [("update", [1]), ("copy",), ("update", [])],
    "several writes": [("update", [1, 2])],
    "consume and finish do nothing": [("update", [1]), ("consume",), ("finish",)],
}


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
@pytest.mark.parametrize("ops", CASES.values(), ids=CASES.keys())
def test_matches_langgraph(
    ops: list[tuple[Any, ...]], guard: bool, trace: Callable[..., Any]
) -> None:
    lg = LgUntrackedValue(int, guard)
    lg.key = "k"
    assert trace(UntrackedValue(int, guard, key="k"), ops) == trace(lg, ops)


def test_value_is_never_checkpointed() -> None:
    channel: UntrackedValue[Any] = UntrackedValue(Any, key="k")
    channel.update([{"secret": 1}])
    assert channel.get() == {"secret": 1}
    assert channel.checkpoint() is MISSING
    assert channel.from_checkpoint({"secret": 1}).is_available() is False


def test_copy_keeps_value_and_spec() -> None:
    channel: UntrackedValue[int] = UntrackedValue(int, guard=False, key="k")
    channel.update([7])
    clone = channel.copy()
    assert (clone.get(), clone.key, clone.typ, clone.guard) == (7, "k", int, False)
    clone.update([8])
    assert channel.get() == 7


def test_guard_names_the_key() -> None:
    with pytest.raises(InvalidUpdateError, match=r"At key 'scratch'.*guard=False"):
        UntrackedValue[int](int, key="scratch").update([1, 2])


def test_compares_by_guard() -> None:
    assert UntrackedValue(int) == UntrackedValue(str)
    assert UntrackedValue(int) != UntrackedValue(int, guard=False)
