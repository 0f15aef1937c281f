"""The ``tools`` stream mode: each tool call's start and end, from LangGraph's ``ToolNode``.

A program switching its graph imports to bulksync may keep ``langgraph.prebuilt``: its
``ToolNode`` runs as a node of a bulksync graph (it finds the task's runtime where it looks
for it), and its tool calls stream as they do on LangGraph.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import ToolNode

from .harness import Conform, collect
from .impls import Impl

pytestmark = pytest.mark.conformance


@tool
def echo(text: str) -> str:
    """Repeat the text."""
    return f"echoed:{text}"


@tool
def broken() -> str:
    """Always fails."""
    raise ValueError("nope")


class State(TypedDict):
    messages: Annotated[list[Any], operator.add]


def _graph(impl: Impl, calls: list[dict[str, Any]]) -> Any:
    def caller(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content="", id="ai-1", tool_calls=calls)]}

    b = impl.StateGraph(State)
    b.add_node("caller", caller)
    b.add_node("tools", ToolNode([echo, broken]))
    b.add_edge(impl.START, "caller")
    b.add_edge("caller", "tools")
    return impl.compile(b)


def _event(chunk: Any) -> Any:
    if not isinstance(chunk, tuple):  # the error that ended the stream
        return chunk
    ns, mode, payload = chunk
    output = payload.get("output")
    shown = {k: v for k, v in payload.items() if k != "output"}
    if output is not None:
        shown["output"] = getattr(output, "content", output)
    return (ns, mode, shown)


def tool_calls_stream(impl: Impl) -> Any:
    one = [{"name": "echo", "args": {"text": "hi"}, "id": "tc1"}]
    failing = [{"name": "broken", "args": {}, "id": "tc2"}]
    modes = ["tools", "updates"]
    ok = _graph(impl, one).stream({"messages": []}, stream_mode=modes, subgraphs=True)
    bad = _graph(impl, failing).stream({"messages": []}, stream_mode=["tools"], subgraphs=True)
    return {
        "ok": [_event(c) for c in collect(ok) if not isinstance(c, tuple) or c[1] == "tools"],
        "failing": [_event(c) for c in collect(bad)],
    }


def test_tool_calls_stream(conform: Conform) -> None:
    conform(tool_calls_stream)


def tool_called_in_a_task_call(impl: Impl) -> Any:
    """A tool called inside a ``@task`` call (itself called by a call) streams its events
    under the entrypoint's graph namespace."""

    @impl.func.task
    def inner() -> str:
        return str(echo.invoke({"text": "deep"}))

    @impl.func.task
    def outer() -> str:
        return str(inner().result())

    @impl.entrypoint(checkpointer=impl.saver())
    def workflow(value: dict[str, Any]) -> str:
        return str(outer().result())

    thread = {"configurable": {"thread_id": "tool-in-task"}}
    chunks = workflow.stream({}, thread, stream_mode=["tools", "updates"], subgraphs=True)
    return [_event(c) for c in collect(chunks)]


def test_tool_called_in_a_task_call(conform: Conform) -> None:
    conform(tool_called_in_a_task_call)
