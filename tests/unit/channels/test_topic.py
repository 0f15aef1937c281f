"""Topic: collects a step's values (lists flattened), cleared or accumulated across steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.channels.topic import Topic as LgTopic

from bulksync.channels import Topic
from bulksync.channels.base import MISSING
from bulksync.errors import EmptyChannelError
from bulksync.types import Send

CASES: dict[str, list[tuple[Any, ...]]] = {
    "values in write order": [("update", [3, 1, 2])],
    "lists flattened one level": [("update", [[1, 2], 3, [[4]], (5, 6)])],
    "empty list writes nothing": [("update", [[]]), ("update", [[], []])],
    "next step replaces or appends": [("update", [1, 2]), ("update", [3])],
    "empty step clears or keeps": [("update", [1]), ("update", []), ("update", [])],
    "restore and append": [("update", [1]), ("restore",), ("update", [[2, 3]]), ("copy",)],
    "restore empty": [("restore",), ("update", []), ("consume",), ("finish",)],
    "stored": [("stored",), ("update", [[1, 2]]), ("stored",), ("update", [3])],
    "duplicates kept": [("update", ["a", "a"]), ("update", [["a"]])],
}


@pytest.mark.parametrize("accumulate", [False, True], ids=["per-step", "accumulate"])
@pytest.mark.parametrize("ops", CASES.values(), ids=CASES.keys())
def test_matches_langgraph(
    ops: list[tuple[Any, ...]], accumulate: bool, trace: Callable[..., Any]
) -> None:
    lg = LgTopic(int, accumulate=accumulate)
    lg.key = "k"
    assert trace(Topic(int, accumulate, key="k"), ops) == trace(lg, ops)


@pytest.mark.parametrize(
    ("accumulate", "expected"), [(False, [3]), (True, [1, 2, 3])], ids=["per-step", "accumulate"]
)
def test_second_step(accumulate: bool, expected: list[int]) -> None:
    topic: Topic[int] = Topic(int, accumulate)
    topic.update([1, 2])
    assert topic.update([3]) is True
    assert topic.get() == expected


def test_empty_step_change_flag() -> None:
    per_step: Topic[int] = Topic(int)
    assert per_step.update([]) is False
    per_step.update([1])
    assert per_step.update([]) is True
    assert per_step.is_available() is False
    kept: Topic[int] = Topic(int, accumulate=True)
    kept.update([1])
    assert kept.update([]) is False
    assert kept.get() == [1]


def test_get_on_empty_raises_but_checkpoint_is_an_empty_list() -> None:
    topic: Topic[int] = Topic(int)
    with pytest.raises(EmptyChannelError):
        topic.get()
    assert topic.checkpoint() == []


def test_get_and_checkpoint_are_copies() -> None:
    topic: Topic[int] = Topic(int, accumulate=True)
    topic.update([1])
    got, stored = topic.get(), topic.checkpoint()
    assert isinstance(got, list)
    got.append(99)
    stored.append(98)
    assert topic.get() == [1]


def test_restored_topic_does_not_alter_the_stored_list() -> None:
    stored = [1, 2]
    live: Topic[int] = Topic(int, accumulate=True, key="k").from_checkpoint(stored)
    live.update([3])
    assert stored == [1, 2]
    assert live.get() == [1, 2, 3]


def test_from_checkpoint_keeps_spec_and_leaves_template() -> None:
    template: Topic[Send] = Topic(Send, accumulate=True, key="__pregel_tasks")
    live = template.from_checkpoint(MISSING)
    live.update([Send("n", {"x": 1})])
    restored = template.from_checkpoint(live.checkpoint())
    assert (restored.key, restored.typ, restored.accumulate) == ("__pregel_tasks", Send, True)
    assert restored.get() == [Send("n", {"x": 1})]
    assert template.is_available() is False


def test_checkpoint_is_plain_data(is_plain: Callable[..., bool]) -> None:
    topic: Topic[Any] = Topic(Any)
    topic.update([Send("n", 1), [{"a": 1}, ("t",)]])
    assert is_plain(topic.checkpoint(), Send)
    assert type(topic.checkpoint()) is list


def test_compares_by_accumulate_like_langgraph() -> None:
    assert Topic(int) == Topic(str)
    assert Topic(int) != Topic(int, accumulate=True)
    assert (LgTopic(int) == LgTopic(int, accumulate=True)) is False
