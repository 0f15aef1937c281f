"""AnyValue: several equal writes per step allowed; a step without a write clears it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.channels.any_value import AnyValue as LgAnyValue

from bulksync.channels import AnyValue
from bulksync.channels.base import MISSING

CASES: dict[str, list[tuple[Any, ...]]] = {
    "one write": [("update", [1])],
    "several writes keep the last": [("update", [1, 1, 2])],
    "empty step clears": [("update", [1]), ("update", []), ("update", [])],
    "None is a value": [("update", [None]), ("restore",), ("copy",)],
    "restore then clear": [("update", ["x"]), ("restore",), ("stored",), ("update", [])],
    "consume and finish do nothing": [("update", [1]), ("consume",), ("finish",)],
}


@pytest.mark.parametrize("ops", CASES.values(), ids=CASES.keys())
def test_matches_langgraph(ops: list[tuple[Any, ...]], trace: Callable[..., Any]) -> None:
    assert trace(AnyValue(int, "k"), ops) == trace(LgAnyValue(int, "k"), ops)


def test_update_results() -> None:
    channel: AnyValue[int] = AnyValue(int)
    assert channel.update([]) is False
    assert channel.update([4, 4]) is True
    assert channel.get() == 4
    assert channel.update([]) is True
    assert channel.is_available() is False


def test_from_checkpoint_keeps_spec_and_leaves_template(is_plain: Callable[..., bool]) -> None:
    template: AnyValue[Any] = AnyValue(dict, "k")
    live = template.from_checkpoint({"a": [1]})
    assert (live.key, live.typ, live.get()) == ("k", dict, {"a": [1]})
    assert is_plain(live.checkpoint())
    assert template.checkpoint() is MISSING


def test_compares_by_class() -> None:
    assert AnyValue(int) == AnyValue(str)
    assert AnyValue(int) != object()
