"""A run an async caller started (``ainvoke``, ``astream``) runs its async nodes on the
caller's event loop, as LangGraph does: they share its asyncio objects (an ``Event`` the
caller waits on, one two nodes hand each other) and run concurrently there; a Runnable node
with an async side of its own (a ``ToolNode`` of async tools) is called through it."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def nodes_share_the_callers_loop(impl: Impl) -> Any:
    async def main() -> Any:
        started = asyncio.Event()  # set by a node, awaited by the caller
        ping, pong = asyncio.Event(), asyncio.Event()  # two nodes of a step hand these on

        async def first(state: State) -> dict[str, Any]:
            started.set()
            ping.set()
            await asyncio.wait_for(pong.wait(), 5)
            return {"log": ["first got pong"]}

        async def second(state: State) -> dict[str, Any]:
            await asyncio.wait_for(ping.wait(), 5)
            pong.set()
            return {"log": ["second got ping"]}

        b = impl.StateGraph(State)
        b.add_node("first", first)
        b.add_node("second", second)
        b.add_edge(impl.START, "first")
        b.add_edge(impl.START, "second")
        graph = impl.compile(b)
        run = asyncio.create_task(graph.ainvoke({"log": []}))
        await asyncio.wait_for(started.wait(), 5)
        chunks = [chunk async for chunk in graph.astream({"log": []})]
        return {"ainvoke": await run, "astream": sorted(map(str, chunks))}

    return asyncio.run(main())


def test_nodes_share_the_callers_loop(conform: Conform) -> None:
    conform(nodes_share_the_callers_loop)


def runnables_called_through_their_async_side(impl: Impl) -> Any:
    from langchain_core.runnables import RunnableLambda

    def sync_side(state: State) -> dict[str, Any]:
        return {"log": ["sync side"]}

    async def async_side(state: State) -> dict[str, Any]:
        return {"log": ["async side"]}

    b = impl.StateGraph(State)
    b.add_node("both", RunnableLambda(sync_side, afunc=async_side))
    b.add_edge(impl.START, "both")
    graph = impl.compile(b)
    return {
        "invoke": graph.invoke({"log": []}),
        "ainvoke": asyncio.run(graph.ainvoke({"log": []})),
    }


def test_runnables_called_through_their_async_side(conform: Conform) -> None:
    conform(runnables_called_through_their_async_side)
