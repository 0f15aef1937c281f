"""The messages stream of one task: tokens, finished messages, and a node's new messages."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from bulksync.workers.messages import listening, message_stream

NODE_META = {"langgraph_node": "n", "langgraph_step": 1}


def collect() -> tuple[list[tuple[Any, dict[str, Any]]], Any]:
    seen: list[tuple[Any, dict[str, Any]]] = []
    return seen, lambda message, meta: seen.append((message, meta))


def test_nothing_is_listened_to_unless_the_run_streams_messages() -> None:
    _, emit = collect()
    assert message_stream(("values", "updates"), emit, NODE_META) is None


def test_a_model_called_in_the_node_streams_its_tokens_once() -> None:
    seen, emit = collect()
    stream = message_stream(("messages",), emit, NODE_META)
    assert stream is not None
    model = GenericFakeChatModel(messages=iter([AIMessage(content="a b", id="m1")]))
    with listening({"callbacks": [stream.handler], "metadata": NODE_META}):
        answer = model.invoke([HumanMessage("hi")])  # no config passed: taken from context
    stream.node_output({"messages": [answer]})  # already streamed: not again
    assert [m.content for m, _ in seen] == ["a", " ", "b"]
    assert all(m.id == "m1" and meta["langgraph_node"] == "n" for m, meta in seen)
    assert "ls_provider" in seen[0][1]  # the model's own metadata joins the node's


def test_a_node_output_reports_only_new_messages() -> None:
    seen, emit = collect()
    stream = message_stream(("messages",), emit, NODE_META)
    assert stream is not None
    old = HumanMessage("hi", id="h1")
    stream.saw_input({"messages": [old]})
    stream.node_output({"messages": [old, AIMessage("new", id="a1")], "other": 3})
    stream.node_output(AIMessage("again", id="a1"))
    assert [(m.id, m.content) for m, _ in seen] == [("a1", "new")]
    assert seen[0][1] == {"ls_integration": "langgraph", **NODE_META}


def test_a_model_tagged_nostream_is_not_streamed() -> None:
    seen, emit = collect()
    stream = message_stream(("messages",), emit, NODE_META)
    assert stream is not None
    model = GenericFakeChatModel(messages=iter([AIMessage(content="x y", id="m2")]))
    quiet = model.with_config(tags=["nostream"])
    with listening({"callbacks": [stream.handler], "metadata": NODE_META}):
        quiet.invoke([HumanMessage("hi")])
    assert seen == []
