"""A caller that stops a run stops its async nodes: breaking off ``astream`` or cancelling
``ainvoke`` cancels the nodes running (they see ``CancelledError``), and no later step
starts."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    value: Annotated[int, operator.add]


class Sleeper:
    """An async node that records whether it started, finished or was cancelled."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.seen: list[str] = []

    async def __call__(self, state: State) -> dict[str, Any]:
        self.seen.append("started")
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.seen.append("cancelled")
            raise
        self.seen.append("finished")
        return {"value": 1}


def _invoke_for_half_a_second(graph: Any) -> str:
    """``ainvoke`` under a 0.5 s ``wait_for``: whether it timed out (cancelling the call)."""

    async def main() -> str:
        try:
            await asyncio.wait_for(graph.ainvoke({"value": 0}), 0.5)
        except TimeoutError:
            return "timed out"
        return "finished"

    return asyncio.run(main())


def breaking_off_astream(impl: Impl) -> Any:
    slow, later = Sleeper(3), Sleeper(0)

    async def quick(state: State) -> dict[str, Any]:
        await asyncio.sleep(0.2)
        return {"value": 2}

    b = impl.StateGraph(State)
    b.add_node("quick", quick)
    b.add_node("slow", slow)
    b.add_node("later", later)
    b.add_edge(impl.START, "quick")
    b.add_edge(impl.START, "slow")
    b.add_edge("quick", "later")
    graph = impl.compile(b, checkpointer=impl.saver())

    async def main() -> Any:
        config = {"configurable": {"thread_id": "break-off"}}
        chunks = []
        stream = graph.astream({"value": 0}, config)
        async for chunk in stream:
            chunks.append(chunk)
            break
        await stream.aclose()
        return chunks

    chunks = asyncio.run(main())
    return {"chunks": chunks, "slow": slow.seen, "later": later.seen}


def test_breaking_off_astream(conform: Conform) -> None:
    conform(breaking_off_astream)


def cancelled_ainvoke(impl: Impl) -> Any:
    slow, later = Sleeper(3), Sleeper(0)
    b = impl.StateGraph(State)
    b.add_node("slow", slow)
    b.add_node("later", later)
    b.add_edge(impl.START, "slow")
    b.add_edge("slow", "later")
    graph = impl.compile(b)

    return {"outcome": _invoke_for_half_a_second(graph), "slow": slow.seen, "later": later.seen}


def test_cancelled_ainvoke(conform: Conform) -> None:
    conform(cancelled_ainvoke)


def cancelled_ainvoke_of_a_nested_graph(impl: Impl) -> Any:
    """A graph an async node invokes stops with the node."""
    inner_node = Sleeper(3)
    inner = impl.StateGraph(State)
    inner.add_node("inner_node", inner_node)
    inner.add_edge(impl.START, "inner_node")
    inner_graph = inner.compile()

    async def invokes(state: State) -> dict[str, Any]:
        return await inner_graph.ainvoke({"value": 0})  # type: ignore[no-any-return]

    b = impl.StateGraph(State)
    b.add_node("invokes", invokes)
    b.add_edge(impl.START, "invokes")
    graph = impl.compile(b)

    return {"outcome": _invoke_for_half_a_second(graph), "inner": inner_node.seen}


def test_cancelled_ainvoke_of_a_nested_graph(conform: Conform) -> None:
    conform(cancelled_ainvoke_of_a_nested_graph)
