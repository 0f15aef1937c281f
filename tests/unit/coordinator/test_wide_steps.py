"""A wide step's bulk work on the coordinator runs with the garbage collector paused.

Decoding the thousands of ``Send``\\ s a node returned, planning their tasks and applying
their writes build objects that all live on (``bulksync.collector``); spies on the loop's
helpers see whether the collector was on while each ran.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.collector import WIDE
from bulksync.constants import TASKS
from bulksync.coordinator import ledger, loop
from bulksync.graph import END, START, StateGraph
from bulksync.types import Send


class State(TypedDict):
    n: int
    done: Annotated[list[int], operator.add]


def fan_out() -> Any:
    builder = StateGraph(State)
    builder.add_node("item", lambda s: {"done": [s["n"]]})
    builder.add_conditional_edges(START, lambda s: [Send("item", {"n": i}) for i in range(s["n"])])
    builder.add_edge("item", END)
    return builder.compile()


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[bool]]]:
    """Whether the collector was on, at each call of the spied helpers, by helper."""
    calls: dict[str, list[bool]] = {"plan": [], "apply": [], "decode": []}

    def spy(module: Any, name: str, key: str, wide: Callable[..., bool]) -> None:
        real = getattr(module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if wide(*args):
                calls[key].append(gc.isenabled())
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    spy(loop, "prepare_next_tasks", "plan", lambda spec, ckpt, channels, *_: _sends(channels))
    spy(loop, "apply_writes", "apply", lambda versions, channels, tasks, *_: len(tasks) >= WIDE)
    spy(ledger, "decoded", "decode", lambda value: isinstance(value, Send))
    was = gc.isenabled()
    gc.enable()
    yield calls
    if not was:
        gc.disable()


def _sends(channels: Any) -> bool:
    topic = channels.get(TASKS)
    return topic is not None and topic.is_available() and len(topic.get()) >= WIDE


def test_a_wide_fan_out_plans_applies_and_decodes_with_the_collector_paused(
    seen: dict[str, list[bool]],
) -> None:
    out = fan_out().invoke({"n": 2 * WIDE, "done": []})
    assert sorted(out["done"]) == list(range(2 * WIDE))
    assert seen["plan"] == [False]  # the step of 512 Sends
    assert seen["apply"] == [False]  # their 512 tasks' writes
    assert seen["decode"] == [False] * 2 * WIDE  # the Sends the first step wrote
    assert gc.isenabled()


def test_a_narrow_step_leaves_the_collector_on(seen: dict[str, list[bool]]) -> None:
    out = fan_out().invoke({"n": 3, "done": []})
    assert sorted(out["done"]) == [0, 1, 2]
    assert all(seen["decode"]) and seen["decode"]
    assert seen["plan"] == seen["apply"] == []
