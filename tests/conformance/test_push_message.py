"""``push_message``: a node streams a message on the ``messages`` mode as it goes, and the
message is written to the state with the node's other writes (an id is required)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from .harness import Conform, attempt
from .impls import Impl

pytestmark = pytest.mark.conformance


def pushed_messages(impl: Impl) -> Any:
    from langchain_core.messages import AIMessage

    # The module add_messages comes from: langgraph.graph.message / bulksync.graph.message.
    push_message = importlib.import_module(impl.add_messages.__module__).push_message
    refused: list[str] = []

    def chat(state: Any) -> dict[str, Any]:
        refused.append(type(attempt(push_message, AIMessage(content="no id"))).__name__)
        push_message(AIMessage(content="first", id="1"))
        push_message({"role": "user", "content": "second", "id": "2"})
        push_message(AIMessage(content="not kept", id="3"), state_key=None)
        return {"messages": [AIMessage(content="returned", id="4")]}

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("chat", chat)
    b.add_edge(impl.START, "chat")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "push"}}
    streamed = [
        (mode, (chunk[0].id, chunk[0].content) if mode == "messages" else None)
        for mode, chunk in g.stream({"messages": []}, cfg, stream_mode=["messages", "updates"])
    ]
    state = [(m.id, m.content) for m in g.get_state(cfg).values["messages"]]
    return {"streamed": streamed, "state": state, "refused": refused}


def test_pushed_messages(conform: Conform) -> None:
    conform(pushed_messages)
