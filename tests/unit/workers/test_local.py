"""The in-process executor: parallel fan-out, bounded by the run's max_concurrency."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.graph import START, StateGraph
from bulksync.types import Send
from bulksync.workers.local import default_concurrency, step_concurrency


class State(TypedDict):
    done: Annotated[list[int], operator.add]


def fan_out_peak(config: dict[str, Any], width: int = 6) -> int:
    """Run a ``width``-way Send fan-out and return how many tasks ran at once at most."""
    lock = threading.Lock()
    running = [0, 0]  # now, peak

    def work(arg: dict[str, int]) -> dict[str, list[int]]:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        time.sleep(0.03)
        with lock:
            running[0] -= 1
        return {"done": [arg["i"]]}

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(width)])
    out = builder.compile().invoke({"done": []}, config)
    assert out == {"done": list(range(width))}
    return running[1]


def test_fan_out_runs_in_parallel() -> None:
    assert fan_out_peak({}) > 1


@pytest.mark.parametrize(
    "config", [{"max_concurrency": 1}, {"configurable": {"max_concurrency": 1}}]
)
def test_max_concurrency_bounds_a_step(config: dict[str, Any]) -> None:
    assert fan_out_peak(config) == 1


@pytest.mark.parametrize("bad", [0, -1, "2", True])
def test_invalid_max_concurrency_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_concurrency must be an integer >= 1"):
        step_concurrency({"max_concurrency": bad}, 4)


def test_failure_with_queued_tasks_raises_instead_of_hanging() -> None:
    """A failing task stops the step: queued tasks are cancelled and the error surfaces."""
    started: list[int] = []

    def work(arg: dict[str, int]) -> dict[str, list[int]]:
        started.append(arg["i"])
        if arg["i"] == 0:
            raise ValueError("task 0 failed")
        time.sleep(0.05)
        return {"done": [arg["i"]]}

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(8)])
    with pytest.raises(ValueError, match="task 0 failed"):
        builder.compile().invoke({"done": []}, {"max_concurrency": 1})
    assert started[0] == 0
    assert len(started) < 8  # the queued tasks never ran


def test_an_async_callers_async_nodes_all_run_at_once_unless_bounded() -> None:
    width = 3 * default_concurrency()  # more than the executor's threads
    barrier: list[asyncio.Barrier] = []

    async def meet(arg: dict[str, int]) -> dict[str, list[int]]:
        await asyncio.wait_for(barrier[0].wait(), 2)  # until all of them run
        return {"done": [arg["i"]]}

    b = StateGraph(State)
    b.add_node("meet", meet)
    b.add_conditional_edges(START, lambda s: [Send("meet", {"i": i}) for i in range(width)])
    graph = b.compile()

    async def run(config: dict[str, Any]) -> Any:
        barrier[:] = [asyncio.Barrier(width)]
        return await graph.ainvoke({"done": []}, config)

    assert sorted(asyncio.run(run({}))["done"]) == list(range(width))
    with pytest.raises(TimeoutError):  # bounded: the barrier never fills
        asyncio.run(run({"max_concurrency": width - 1}))
