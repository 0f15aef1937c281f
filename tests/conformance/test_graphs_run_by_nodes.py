"""Graphs a node runs itself: one invoked on a thread of its own is a run of its own on that
thread, not the node's subgraph; one a node streams is the node's subgraph, and a caller
reading its subgraphs' events gets its events too."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


class Count(TypedDict, total=False):
    count: int


class Parent(TypedDict, total=False):
    answer: str


def _segment_names(ns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(segment.split(":")[0] for segment in ns)


def _counter(impl: Impl, **compile_kw: Any) -> Any:
    b = impl.StateGraph(Count)
    b.add_node("n", lambda s: {"count": (s.get("count") or 0) + 1})
    b.add_edge(impl.START, "n")
    return impl.compile(b, **compile_kw)


def _one_node(impl: Impl, schema: Any, node: Any, **compile_kw: Any) -> Any:
    b = impl.StateGraph(schema)
    b.add_node("node", node)
    b.add_edge(impl.START, "node")
    return impl.compile(b, **compile_kw)


def graph_invoked_on_its_own_thread(impl: Impl) -> Any:
    """The child keeps its own history on its thread (root namespace), across parent runs."""
    child = _counter(impl, checkpointer=impl.saver())
    child_cfg = {"configurable": {"thread_id": "own-child"}}

    def call_child(state: Parent) -> dict[str, Any]:
        return {"answer": str(child.invoke({}, child_cfg)["count"])}

    parent = _one_node(impl, Parent, call_child, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "own-parent"}}
    answers = [parent.invoke({"answer": ""}, cfg)["answer"] for _ in range(2)]
    child_state = child.get_state(child_cfg)
    return {
        "answers": answers,
        "child": child_state.values,
        "child_ns": child_state.config["configurable"]["checkpoint_ns"],
        "child_steps": len(list(child.get_state_history(child_cfg))),
        "parent": parent.get_state(cfg).values,
    }


def test_graph_invoked_on_its_own_thread(conform: Conform) -> None:
    conform(graph_invoked_on_its_own_thread)


def graph_invoked_with_the_nodes_own_config(impl: Impl) -> Any:
    """A node handing its own config to ``invoke`` runs the child as its subgraph: the
    child's updates stream under the node, and its ``Command.PARENT`` reaches the parent."""
    cb = impl.StateGraph(Count)
    cb.add_node(
        "jump",
        lambda s: (
            impl.Command(graph=impl.Command.PARENT, goto="after")
            if s.get("count")
            else {"count": 1}
        ),
    )
    cb.add_edge(impl.START, "jump")
    child = impl.compile(cb)

    def call_child(state: Parent, config: RunnableConfig) -> dict[str, Any]:
        child.invoke({"count": 0}, config)
        child.invoke({"count": 1}, config)  # jumps: this node's update is not applied
        return {"answer": "not reached"}

    b = impl.StateGraph(Parent)
    b.add_node("call_child", call_child)
    b.add_node("after", lambda s: {"answer": "after"})
    b.add_edge(impl.START, "call_child")
    parent = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "own-config"}}
    parts = parent.stream({"answer": ""}, cfg, stream_mode="updates", subgraphs=True)
    return [(_segment_names(ns), update) for ns, update in parts]


def test_graph_invoked_with_the_nodes_own_config(conform: Conform) -> None:
    conform(graph_invoked_with_the_nodes_own_config)


def model_events_of_a_graph_on_its_own_thread(impl: Impl) -> Any:
    """Its model's tokens reach a caller reading subgraphs, at the child's own namespace;
    its updates do not, and a caller reading only its own graph gets none of them."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    def chat(state: Any) -> dict[str, Any]:
        model = GenericFakeChatModel(messages=iter(["one two"]))
        return {"messages": [model.invoke("hi")]}

    child = _one_node(impl, impl.MessagesState, chat)

    def call_child(state: Any) -> dict[str, Any]:
        child.invoke({"messages": []}, {"configurable": {"thread_id": "own-chat"}})
        return {}

    parent = _one_node(impl, impl.MessagesState, call_child)
    seen = {}
    for subgraphs in (False, True):
        parts = parent.stream(
            {"messages": []}, stream_mode=["messages", "updates"], subgraphs=subgraphs
        )
        seen[str(subgraphs)] = [
            (
                _segment_names(part[0]) if subgraphs else (),
                part[-2],
                part[-1][0].content if part[-2] == "messages" else part[-1],
            )
            for part in parts
        ]
    return seen


def test_model_events_of_a_graph_on_its_own_thread(conform: Conform) -> None:
    conform(model_events_of_a_graph_on_its_own_thread)


def graph_streamed_by_a_node(impl: Impl) -> Any:
    """The node reads the child's stream; the caller reading subgraphs gets the child's
    events too, under the node's namespace."""
    child = _counter(impl)
    read: list[Any] = []

    def stream_child(state: Parent) -> dict[str, Any]:
        read.extend(child.stream({"count": 1}, stream_mode="updates"))
        return {"answer": "streamed"}

    parent = _one_node(impl, Parent, stream_child)
    seen = {}
    for subgraphs in (False, True):
        parts = parent.stream({"answer": ""}, stream_mode="updates", subgraphs=subgraphs)
        seen[str(subgraphs)] = [
            (_segment_names(part[0]), part[1]) if subgraphs else part for part in parts
        ]
    return {"caller": seen, "node": read}


def test_graph_streamed_by_a_node(conform: Conform) -> None:
    conform(graph_streamed_by_a_node)
