"""Node and task timeouts (``TimeoutPolicy``): an attempt of an async node that outruns its
run or idle timeout fails with ``NodeTimeoutError``, which retry policies and error handlers
see like any failure; progress (a heartbeat, a stream write) keeps an idle timeout from
firing; a ``Send`` may carry a timeout of its own; ``@task`` calls and entrypoints are timed
alike."""

from __future__ import annotations

import asyncio
import operator
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

if TYPE_CHECKING:  # a handler declares it by name: LangGraph injects a parameter so annotated
    from bulksync.errors import NodeError

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _outcome(graph: Any, value: Any, thread: str) -> Any:
    """What ``ainvoke`` gave (async nodes run only there on LangGraph): its output, or the
    timeout it failed with (node, kind, seconds, and the policy's two limits)."""
    config = {"configurable": {"thread_id": thread}}
    try:
        return {"output": asyncio.run(graph.ainvoke(value, config))}
    except Exception as exc:
        if type(exc).__name__ != "NodeTimeoutError":
            raise
        return {"timeout": [exc.node, exc.kind, exc.timeout, exc.idle_timeout, exc.run_timeout]}  # type: ignore[attr-defined]


def _graph(impl: Impl, node: Any, **node_kw: Any) -> Any:
    b = impl.StateGraph(State)
    b.add_node("work", node, **node_kw)
    b.add_edge(impl.START, "work")
    return impl.compile(b, checkpointer=impl.saver())


async def _sleeps(state: State) -> dict[str, Any]:
    await asyncio.sleep(3)
    return {"log": ["finished"]}


def run_and_idle_timeouts(impl: Impl) -> Any:
    """Each limit fires on a node that neither finishes nor shows progress; the run's state
    keeps the timed-out step pending."""
    results = {}
    for name, timeout in {
        "run": 0.2,
        "idle": impl.TimeoutPolicy(idle_timeout=0.2),
        "both": impl.TimeoutPolicy(run_timeout=0.3, idle_timeout=5),
    }.items():
        graph = _graph(impl, _sleeps, timeout=timeout)
        results[name] = _outcome(graph, {"log": []}, f"timeouts-{name}")
        config = {"configurable": {"thread_id": f"timeouts-{name}"}}
        results[f"{name} next"] = list(graph.get_state(config).next)
    return results


def test_run_and_idle_timeouts(conform: Conform) -> None:
    conform(run_and_idle_timeouts)


def progress_keeps_an_idle_timeout_off(impl: Impl) -> Any:
    """Heartbeats count under either ``refresh_on``; stream writes only under ``auto``."""

    async def beats(state: State, runtime: Any) -> dict[str, Any]:
        for _ in range(6):
            await asyncio.sleep(0.1)
            runtime.heartbeat()
        return {"log": ["beat"]}

    async def writes(state: State) -> dict[str, Any]:
        writer = impl.get_stream_writer()
        for i in range(6):
            await asyncio.sleep(0.1)
            writer({"progress": i})
        return {"log": ["wrote"]}

    results = {}
    for name, node in {"beats": beats, "writes": writes}.items():
        for refresh in ("auto", "heartbeat"):
            policy = impl.TimeoutPolicy(idle_timeout=0.3, refresh_on=refresh)
            graph = _graph(impl, node, timeout=policy)
            results[f"{name} {refresh}"] = _outcome(graph, {"log": []}, f"{name}-{refresh}")
    return results


def test_progress_keeps_an_idle_timeout_off(conform: Conform) -> None:
    conform(progress_keeps_an_idle_timeout_off)


def timeouts_retried_and_handled(impl: Impl) -> Any:
    """A retry policy retries a timed-out attempt; an error handler gets the timeout."""
    attempts: list[int] = []

    async def slow_once(state: State) -> dict[str, Any]:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            await asyncio.sleep(3)
        return {"log": [f"attempt {len(attempts)}"]}

    retry = impl.RetryPolicy(
        max_attempts=3, initial_interval=0.0, jitter=False, retry_on=impl.errors.NodeTimeoutError
    )
    retried = _graph(impl, slow_once, timeout=0.3, retry_policy=retry)
    out = _outcome(retried, {"log": []}, "retried")

    def handler(state: State, error: NodeError) -> dict[str, Any]:
        return {"log": [f"handled {type(error.error).__name__} of {error.node}"]}

    handled = _graph(impl, _sleeps, timeout=0.3, error_handler=handler)
    return {
        "retried": out,
        "attempts": len(attempts),
        "handled": _outcome(handled, {"log": []}, "handled"),
    }


def test_timeouts_retried_and_handled(conform: Conform) -> None:
    conform(timeouts_retried_and_handled)


def send_timeout_replaces_the_nodes(impl: Impl) -> Any:
    """Of two Sends to one node, the one with a short timeout of its own times out."""

    async def work(arg: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(arg["seconds"])
        return {"log": [f"slept {arg['seconds']}"]}

    def fan_out(state: State) -> list[Any]:
        return [
            impl.Send("work", {"seconds": 0.05}),
            impl.Send("work", {"seconds": 2}, timeout=impl.TimeoutPolicy(idle_timeout=0.2)),
        ]

    b = impl.StateGraph(State)
    b.add_node("work", work, timeout=10)
    b.add_conditional_edges(impl.START, fan_out, ["work"])
    graph = impl.compile(b, checkpointer=impl.saver())
    return _outcome(graph, {"log": []}, "send-timeout")


def test_send_timeout_replaces_the_nodes(conform: Conform) -> None:
    conform(send_timeout_replaces_the_nodes)


def timed_tasks_and_entrypoints(impl: Impl) -> Any:
    @impl.func.task(timeout=impl.TimeoutPolicy(idle_timeout=0.2))
    async def slow_call(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @impl.entrypoint(checkpointer=impl.saver())
    async def calls(seconds: float) -> str:
        return await slow_call(seconds)  # type: ignore[no-any-return]

    @impl.entrypoint(checkpointer=impl.saver(), timeout=0.2)
    async def timed(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    return {
        f"{name} {seconds}": _outcome(graph, seconds, f"{name}-{seconds}")
        for name, graph in {"calls": calls, "timed": timed}.items()
        for seconds in (0.01, 2)
    }


def test_timed_tasks_and_entrypoints(conform: Conform) -> None:
    conform(timed_tasks_and_entrypoints)


def sync_nodes_refuse_a_timeout(impl: Impl) -> Any:
    """Only a coroutine can be stopped: a timeout on a sync node, task or entrypoint is
    refused when it is declared or compiled, naming it; a timeout of 0 is refused at once."""
    refused = {}

    def sync(state: State) -> dict[str, Any]:
        return {}

    b = impl.StateGraph(State)
    b.add_node("sync", sync, timeout=1)
    b.add_edge(impl.START, "sync")
    for what, declare in {
        "node": lambda: impl.compile(b),
        "task": lambda: impl.func.task(timeout=1)(lambda x: x),
        "entrypoint": lambda: impl.func.entrypoint(timeout=1)(lambda x: x),
        "zero": lambda: impl.StateGraph(State).add_node("n", _sleeps, timeout=0),
        "zero send": lambda: impl.Send("n", {}, timeout=0),
    }.items():
        with pytest.raises(ValueError) as info:
            declare()
        message = str(info.value)
        refused[what] = "only supported for async nodes" in message or "greater than 0" in message
    return refused


def test_sync_nodes_refuse_a_timeout(conform: Conform) -> None:
    conform(sync_nodes_refuse_a_timeout)
