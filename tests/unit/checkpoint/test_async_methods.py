"""A saver's async twins give what its sync methods give (LangGraph code awaits them)."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.graph import START, StateGraph


class S(TypedDict):
    x: int


def test_async_twins_read_and_write_as_the_sync_methods() -> None:
    saver = InMemorySaver()
    graph = (
        StateGraph(S)
        .add_node("inc", lambda s: {"x": s["x"] + 1})
        .add_edge(START, "inc")
        .compile(checkpointer=saver)
    )
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({"x": 1}, config)
    expected = [t.checkpoint.id for t in saver.list(config)]

    async def read() -> Any:
        head = await saver.aget_tuple(config)
        listed = [t.checkpoint.id async for t in saver.alist(config)]
        assert head is not None
        await saver.aput_writes(head.config, [("x", 5)], "task-1")
        again = await saver.aget_tuple(head.config)
        await saver.adelete_thread("t")
        return head.checkpoint.id, listed, again, await saver.aget_tuple(config)

    head_id, listed, again, gone = asyncio.run(read())
    assert listed == expected and head_id == expected[0]
    assert again is not None and ("task-1", "x", 5) in again.pending_writes
    assert gone is None
