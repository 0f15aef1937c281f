"""The functional API: ``@entrypoint`` graphs and their ``@task`` calls.

Calls run concurrently, so a scenario that streams them observes their chunks as a sorted
list (LangGraph's order depends on which finishes first). What a resumed entrypoint runs
again is counted in a module-level dict keyed by the scenario's flavour: on the cluster the
calls run on the session's worker threads, in this process.
"""

from __future__ import annotations

import collections
import time
from typing import Any, TypedDict

import pytest

from .harness import Conform, attempt
from .impls import Impl

pytestmark = pytest.mark.conformance

RUNS: collections.Counter[str] = collections.Counter()
"""How often each (flavour, call) ran, across a scenario's runs."""


class Numbers(TypedDict):
    values: list[int]


def _sorted(chunks: list[Any]) -> list[Any]:
    return sorted(chunks, key=repr)


def calls_then_interrupt(impl: Impl) -> Any:
    """Calls fan out, the entrypoint pauses; on resume the finished calls are not run again."""
    key = f"{impl.name}:mapper"
    RUNS[key] = 0

    @impl.func.task()
    def mapper(item: int) -> str:
        RUNS[key] += 1
        time.sleep(item / 100)
        return str(item) * 2

    @impl.entrypoint(checkpointer=impl.saver())
    def workflow(items: list[int]) -> list[str]:
        mapped = [f.result() for f in [mapper(i) for i in items]]
        answer = impl.interrupt("question")
        return [m + answer for m in mapped]

    thread = {"configurable": {"thread_id": "calls"}}
    chunks = list(workflow.stream([0, 1, 2], thread))
    ran_before = RUNS[key]
    output = workflow.invoke(impl.Command(resume="!"), thread)
    return {
        "calls": _sorted(chunks[:-1]),
        "paused": chunks[-1],
        "output": output,
        "ran": (ran_before, RUNS[key]),
        "state": workflow.get_state(thread).values,
        "next": workflow.get_state(thread).next,
    }


def test_calls_then_interrupt(conform: Conform) -> None:
    conform(calls_then_interrupt)


def chained_and_nested_calls(impl: Impl) -> Any:
    """A call's result feeds the next; a call makes calls of its own; updates stream in order."""

    @impl.func.task
    def shout(text: str) -> str:
        return text.upper()

    @impl.func.task(name="decorate")
    def wrap(text: str, mark: str = "*") -> str:
        return mark + shout(text).result() + mark

    @impl.entrypoint(checkpointer=impl.saver())
    def workflow(state: dict[str, str]) -> dict[str, str]:
        first = wrap(state["a"]).result()
        return {"a": wrap(first, mark="#").result()}

    thread = {"configurable": {"thread_id": "chain"}}
    return {
        "stream": list(workflow.stream({"a": "x"}, thread)),
        "state": workflow.get_state(thread).values,
    }


def test_chained_and_nested_calls(conform: Conform) -> None:
    conform(chained_and_nested_calls)


def previous_and_final(impl: Impl) -> Any:
    """``previous`` is what the last run saved; ``entrypoint.final`` returns one value and
    saves another; ``update_state`` sets what the next run gets."""

    @impl.entrypoint(checkpointer=impl.saver())
    def counter(item: str, *, previous: Any = None) -> Any:
        seen = previous or []
        return impl.func.entrypoint.final(value=len(seen), save=[*seen, item])

    thread = {"configurable": {"thread_id": "previous"}}
    outputs = [counter.invoke(item, thread) for item in ("a", "b", "c")]
    counter.update_state(thread, ["reset"])
    return {
        "outputs": outputs,
        "after_update": counter.invoke("d", thread),
        "history": [(s.values, s.next) for s in counter.get_state_history(thread)][:4],
    }


def test_previous_and_final(conform: Conform) -> None:
    conform(previous_and_final)


def failing_call(impl: Impl) -> Any:
    """A call's error reaches the caller; the calls that finished are not run again when the
    thread is resumed after the failure is fixed."""
    key = f"{impl.name}:fail"
    RUNS[key] = 0
    broken = {"yes": True}

    @impl.func.task
    def fine(item: int) -> int:
        RUNS[key] += 1
        return item * 10

    @impl.func.task
    def flaky(item: int) -> int:
        if broken["yes"]:
            raise ValueError(f"item {item} failed")
        return item

    @impl.entrypoint(checkpointer=impl.saver())
    def workflow(item: int) -> int:
        return int(fine(item).result() + flaky(item).result())

    thread = {"configurable": {"thread_id": "fail"}}
    error = attempt(lambda: workflow.invoke(3, thread))
    broken["yes"] = False
    return {"error": error, "retried": workflow.invoke(None, thread), "fine ran": RUNS[key]}


def test_failing_call(conform: Conform) -> None:
    conform(failing_call)


def task_in_state_graph_node(impl: Impl) -> Any:
    """A ``StateGraph`` node may call tasks too: their updates stream before the node's."""

    @impl.func.task
    def double(value: int) -> int:
        return value * 2

    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"values": [f.result() for f in [double(v) for v in state["values"]]]}

    b = impl.StateGraph(Numbers)
    b.add_node("node", node)
    b.add_edge(impl.START, "node")
    graph = impl.compile(b, checkpointer=impl.saver())
    thread = {"configurable": {"thread_id": "node"}}
    chunks = list(graph.stream({"values": [1, 2, 3]}, thread))
    return {"calls": _sorted(chunks[:-1]), "node": chunks[-1]}


def test_task_in_state_graph_node(conform: Conform) -> None:
    conform(task_in_state_graph_node)


def async_entrypoint(impl: Impl) -> Any:
    """An async entrypoint awaits its async calls, gathered."""
    import asyncio

    @impl.func.task
    async def square(value: int) -> int:
        await asyncio.sleep(0.01)
        return value * value

    @impl.entrypoint(checkpointer=impl.saver())
    async def workflow(values: list[int]) -> list[int]:
        return list(await asyncio.gather(*[square(v) for v in values]))

    thread = {"configurable": {"thread_id": "async"}}
    return asyncio.run(workflow.ainvoke([1, 2, 3], thread))


def test_async_entrypoint(conform: Conform) -> None:
    conform(async_entrypoint)
