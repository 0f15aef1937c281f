"""Streaming: every stream mode, mode lists, custom writers, and subgraph namespaces."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform, attempt, collect
from .impls import Impl
from .ordering import FinishOrder

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    note: str


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _pipeline(impl: Impl, **compile_kw: Any) -> Any:
    """START → one → (two, three in parallel, three finishing first) → END."""
    order = FinishOrder(["three", "two"])

    def one(state: State) -> dict[str, Any]:
        impl.get_stream_writer()({"from": "one", "seen": len(state["log"])})
        return {"log": ["one"], "note": "one"}

    def parallel(name: str) -> Any:
        def node(state: State) -> dict[str, Any]:
            order.wait_turn(name)
            impl.get_stream_writer()(f"{name} says hi")
            order.finish(name)
            return {"log": [name]}

        return node

    b = impl.StateGraph(State)
    b.add_node("one", one)
    b.add_node("two", parallel("two"))
    b.add_node("three", parallel("three"))
    b.add_edge(impl.START, "one")
    b.add_edge("one", "two")
    b.add_edge("one", "three")
    return impl.compile(b, **compile_kw)


def stream_values_and_updates(impl: Impl) -> Any:
    inp = {"log": ["in"]}
    return {
        "values": list(_pipeline(impl).stream(inp, stream_mode="values")),
        "updates": list(_pipeline(impl).stream(inp, stream_mode="updates")),
        "default_mode": list(_pipeline(impl).stream(inp)),
    }


def test_stream_values_and_updates(conform: Conform) -> None:
    conform(stream_values_and_updates)


def stream_custom(impl: Impl) -> Any:
    inp: dict[str, Any] = {"log": []}
    return {
        "custom": list(_pipeline(impl).stream(inp, stream_mode="custom")),
        "custom_and_updates": list(_pipeline(impl).stream(inp, stream_mode=["custom", "updates"])),
        "writer_outside_node": attempt(lambda: impl.get_stream_writer()("ignored")),
    }


def test_stream_custom(conform: Conform) -> None:
    conform(stream_custom)


def stream_mode_list(impl: Impl) -> Any:
    modes = ["updates", "values", "custom"]
    return {"chunks": list(_pipeline(impl).stream({"log": []}, stream_mode=modes))}


def test_stream_mode_list(conform: Conform) -> None:
    conform(stream_mode_list)


def stream_debug(impl: Impl) -> Any:
    g = _pipeline(impl, checkpointer=impl.saver())
    return {"debug": list(g.stream({"log": []}, _cfg("dbg"), stream_mode="debug"))}


def test_stream_debug(conform: Conform) -> None:
    conform(stream_debug)


def stream_tasks(impl: Impl) -> Any:
    g = _pipeline(impl, checkpointer=impl.saver())
    plain = _pipeline(impl)
    return {
        "checkpointed": list(g.stream({"log": []}, _cfg("tasks"), stream_mode="tasks")),
        "no_saver": list(plain.stream({"log": []}, stream_mode="tasks")),
    }


def test_stream_tasks(conform: Conform) -> None:
    conform(stream_tasks)


def stream_checkpoints(impl: Impl) -> Any:
    g = _pipeline(impl, checkpointer=impl.saver())
    cfg = _cfg("ckpts")
    chunks = list(g.stream({"log": []}, cfg, stream_mode="checkpoints"))
    history = [s.config for s in g.get_state_history(cfg)]
    return {"chunks": chunks, "history_configs": history[::-1]}


def test_stream_checkpoints(conform: Conform) -> None:
    conform(stream_checkpoints)


def stream_errors_and_interrupts_in_debug(impl: Impl) -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"note": impl.interrupt("why?")}

    def boom(state: State) -> dict[str, Any]:
        raise KeyError("boom")

    b = impl.StateGraph(State)
    b.add_node("ask", ask)
    b.add_edge(impl.START, "ask")
    g = impl.compile(b, checkpointer=impl.saver())
    c = impl.StateGraph(State)
    c.add_node("boom", boom)
    c.add_edge(impl.START, "boom")
    h = impl.compile(c, checkpointer=impl.saver())
    cfg = _cfg("dbg-int")
    return {
        "interrupt": list(g.stream({"log": []}, cfg, stream_mode=["tasks", "updates"])),
        "resume": list(g.stream(impl.Command(resume="because"), cfg, stream_mode="tasks")),
        "error": collect(h.stream({"log": []}, _cfg("dbg-err"), stream_mode="tasks")),
    }


def test_stream_errors_and_interrupts_in_debug(conform: Conform) -> None:
    conform(stream_errors_and_interrupts_in_debug)


def _parent_with_child(impl: Impl) -> Any:
    """A parent whose node `child` is a compiled subgraph (sharing `log`) emitting custom."""

    def inner(state: State) -> dict[str, Any]:
        impl.get_stream_writer()("from inner")
        return {"log": ["inner"]}

    cb = impl.StateGraph(State)
    cb.add_node("inner", inner)
    cb.add_node("inner2", lambda s: {"note": "inner2"})
    cb.add_edge(impl.START, "inner")
    cb.add_edge("inner", "inner2")
    child = impl.compile(cb)

    pb = impl.StateGraph(State)
    pb.add_node("before", lambda s: {"log": ["before"]})
    pb.add_node("child", child)
    pb.add_node("after", lambda s: {"log": ["after"]})
    pb.add_edge(impl.START, "before")
    pb.add_edge("before", "child")
    pb.add_edge("child", "after")
    return impl.compile(pb)


def stream_subgraphs_namespaces(impl: Impl) -> Any:
    g = _parent_with_child(impl)
    inp: dict[str, Any] = {"log": []}
    return {
        "updates": list(g.stream(inp, stream_mode="updates", subgraphs=True)),
        "modes": list(g.stream(inp, stream_mode=["values", "custom"], subgraphs=True)),
        "without": list(g.stream(inp, stream_mode="updates")),
    }


def test_stream_subgraphs_namespaces(conform: Conform) -> None:
    conform(stream_subgraphs_namespaces)


def astream_modes(impl: Impl) -> Any:
    async def slow(state: State) -> dict[str, Any]:
        impl.get_stream_writer()("async custom")
        await asyncio.sleep(0)
        return {"log": ["slow"]}

    b = impl.StateGraph(State)
    b.add_node("slow", slow)
    b.add_node("sync", lambda s: {"note": "sync"})
    b.add_edge(impl.START, "slow")
    b.add_edge("slow", "sync")
    g = impl.compile(b)

    async def run() -> Any:
        modes = ["values", "updates", "custom"]
        return [c async for c in g.astream({"log": []}, stream_mode=modes)]

    return {"chunks": asyncio.run(run())}


def test_astream_modes(conform: Conform) -> None:
    conform(astream_modes)


def stream_and_invoke_v2(impl: Impl) -> Any:
    """``version="v2"``: typed parts, interrupts out of the values, ``GraphOutput``."""

    class Form(TypedDict, total=False):
        log: Annotated[list[str], operator.add]
        answer: str

    def ask(state: Form) -> dict[str, Any]:
        return {"answer": impl.interrupt("name?"), "log": ["asked"]}

    b = impl.StateGraph(Form)
    b.add_node("prepare", lambda s: {"log": ["prepared"]})
    b.add_node("ask", ask)
    b.add_edge(impl.START, "prepare")
    b.add_edge("prepare", "ask")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("v2")
    parts = list(g.stream({"log": []}, cfg, stream_mode=["values", "updates"], version="v2"))
    resumed = g.invoke(impl.Command(resume="Ada"), cfg, version="v2")
    again = _cfg("v2-updates")
    updates = g.invoke({"log": []}, again, stream_mode="updates", version="v2")
    return {
        "parts": parts,
        "output": (type(resumed).__name__, resumed.value, resumed.interrupts),
        "updates": updates,
    }


def test_stream_and_invoke_v2(conform: Conform) -> None:
    conform(stream_and_invoke_v2)


def stream_messages(impl: Impl) -> Any:
    """``stream_mode="messages"``: a chat model's tokens as it streams them, then the messages
    a node returns that it did not receive, each with the node's metadata."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    model = GenericFakeChatModel(messages=iter([AIMessage(content="two words", id="ai-1")]))

    def call_model(state: Any) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def reply(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content="done", id="ai-2"), state["messages"][0]]}

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("call_model", call_model)
    b.add_node("reply", reply)
    b.add_edge(impl.START, "call_model")
    b.add_edge("call_model", "reply")
    g = impl.compile(b)
    keys = ("langgraph_node", "langgraph_step", "langgraph_triggers", "ls_provider", "user")
    chunks = g.stream(
        {"messages": [("user", "hi")]}, {"metadata": {"user": "u1"}}, stream_mode="messages"
    )
    return [
        (type(m).__name__, m.content, m.id, {k: meta.get(k) for k in keys}) for m, meta in chunks
    ]


def test_stream_messages(conform: Conform) -> None:
    conform(stream_messages)


def checkpoints_stream_at_a_pause_and_at_the_step_limit(impl: Impl) -> Any:
    """The ``checkpoints`` stream shows the checkpoint a run pauses on after a node
    (``interrupt_after``), and the last one saved when the run runs out of steps."""

    class Counter(TypedDict):
        x: int

    def view(chunk: dict[str, Any]) -> Any:
        return (chunk["metadata"]["step"], chunk["next"], chunk["values"])

    b = impl.StateGraph(Counter)
    b.add_node("one", lambda s: {"x": 1})
    b.add_node("two", lambda s: {"x": 2})
    b.add_edge(impl.START, "one")
    b.add_edge("one", "two")
    paused = impl.compile(b, checkpointer=impl.saver(), interrupt_after=["one"])
    thread = {"configurable": {"thread_id": "pause"}}
    at_pause = [view(c) for c in paused.stream({"x": 0}, thread, stream_mode="checkpoints")]
    head = paused.get_state(thread).config["configurable"]["checkpoint_id"]
    last = list(paused.stream(None, thread, stream_mode="checkpoints"))

    loop = impl.StateGraph(Counter)
    loop.add_node("loop", lambda s: {"x": s["x"] + 1})
    loop.add_edge(impl.START, "loop")
    loop.add_edge("loop", "loop")
    looping = impl.compile(loop, checkpointer=impl.saver())
    limited = {"configurable": {"thread_id": "limit"}, "recursion_limit": 3}
    at_limit = collect(looping.stream({"x": 0}, limited, stream_mode="checkpoints"))
    return {
        "at_pause": at_pause,
        "pause_is_head": bool(last) and last[0]["config"]["configurable"]["checkpoint_id"] == head,
        "at_limit": [view(c) if isinstance(c, dict) else c for c in at_limit],
    }


def test_checkpoints_stream_at_a_pause_and_at_the_step_limit(conform: Conform) -> None:
    conform(checkpoints_stream_at_a_pause_and_at_the_step_limit)


def subgraph_checkpoints_name_their_parents(impl: Impl) -> Any:
    """A subgraph's streamed checkpoints carry the ``checkpoint_map`` of the graphs above it,
    as the same checkpoints read from the history do."""

    class Log(TypedDict):
        log: Annotated[list[str], operator.add]

    cb = impl.StateGraph(Log)
    cb.add_node("inner", lambda s: {"log": ["inner"]})
    cb.add_edge(impl.START, "inner")
    b = impl.StateGraph(Log)
    b.add_node("child", impl.compile(cb))
    b.add_edge(impl.START, "child")
    g = impl.compile(b, checkpointer=impl.saver())
    chunks = g.stream({"log": []}, _cfg("maps"), stream_mode="checkpoints", subgraphs=True)
    return [
        (ns, sorted(c["config"]["configurable"].get("checkpoint_map", {})), c["next"])
        for ns, c in chunks
    ]


def test_subgraph_checkpoints_name_their_parents(conform: Conform) -> None:
    conform(subgraph_checkpoints_name_their_parents)
