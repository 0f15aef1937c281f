"""The in-process executor: parallel fan-out, bounded by the run's max_concurrency."""

from __future__ import annotations

import asyncio
import contextvars
import operator
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.coordinator.reactor import Reactor
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


class Where(TypedDict, total=False):
    threads: Annotated[list[str], operator.add]


def _where(state: Where) -> Where:
    return {"threads": [threading.current_thread().name]}


def _threads_of(graph: Any, given: Where | None = None) -> list[str]:
    out = graph.invoke(given or {"threads": []})
    return list(out["threads"])


def test_a_lone_sync_task_runs_on_the_thread_that_drives_the_run() -> None:
    """As on LangGraph: a step of one sync task starts no thread for it; it runs on the
    caller's thread, which drives the run. Unless the caller reads what nodes stream as
    they run: then it runs beside the reader, which takes each chunk as it comes."""
    b = StateGraph(Where)
    b.add_node("a", _where).add_node("b", _where)
    b.add_edge(START, "a").add_edge("a", "b")
    graph = b.compile()
    here = threading.current_thread().name
    assert _threads_of(graph) == [here] * 2
    values = list(graph.stream({"threads": []}, stream_mode="values"))
    assert values[-1]["threads"] == [here] * 2
    live = list(graph.stream({"threads": []}, stream_mode=["values", "custom"]))
    assert here not in live[-1][1]["threads"]


_CALLERS = contextvars.ContextVar[str]("callers")


def _sees(state: Where) -> Where:
    return {"threads": [_CALLERS.get("nothing")]}


def test_a_run_sees_none_of_its_callers_context_variables() -> None:
    """On its caller's thread, a run's loop starts from an empty context, as on a thread of
    its own: a lone task run by the loop sees the same."""
    b = StateGraph(Where)
    b.add_node("a", _sees).add_edge(START, "a")
    graph = b.compile()
    token = _CALLERS.set("the caller's")
    try:
        assert _threads_of(graph) == ["nothing"]
        assert list(graph.stream({"threads": []}, stream_mode="values"))[-1] == {
            "threads": ["nothing"]
        }
    finally:
        _CALLERS.reset(token)


def test_a_reactors_threads_never_run_a_node() -> None:
    """A run the coordinator service drives on its reactor leaves its threads free for the
    other runs: even a lone task runs on a thread of its own."""
    b = StateGraph(Where)
    b.add_node("a", _where).add_edge(START, "a")
    reactor = Reactor(1, name="test-reactor")
    ended: list[Any] = []
    done = threading.Event()
    try:
        b.compile().start(
            {"threads": []},
            None,
            reactor,
            lambda ns, mode, chunk: None,
            lambda outcome, error: (ended.append(outcome or error), done.set()),
        )
        assert done.wait(10)
    finally:
        reactor.close()
    (where,) = ended[0].output["threads"]
    assert not where.startswith(("test-reactor", "bulksync-run-"))


def test_a_fan_out_and_a_step_with_a_deadline_run_on_pool_threads() -> None:
    """Several tasks run side by side; under ``step_timeout`` the run's thread stays free to
    stop a step that outruns it."""
    fan = StateGraph(Where)
    fan.add_node("work", _where)
    fan.add_conditional_edges(START, lambda s: [Send("work", {}) for _ in range(2)])
    assert not any(t.startswith("bulksync-run-") for t in _threads_of(fan.compile()))

    timed = StateGraph(Where)
    timed.add_node("a", _where).add_edge(START, "a")
    graph = timed.compile()
    graph.step_timeout = 5
    (where,) = _threads_of(graph)
    assert not where.startswith("bulksync-run-")


def test_a_lone_slow_task_still_outruns_its_step_timeout() -> None:
    def slow(state: Where) -> Where:
        time.sleep(2.0)
        return {"threads": ["slow"]}

    b = StateGraph(Where)
    b.add_node("slow", slow).add_edge(START, "slow")
    graph = b.compile()
    graph.step_timeout = 0.05
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="step_timeout"):
        graph.invoke({"threads": []})
    assert time.monotonic() - started < 1.5  # it did not wait for the node
