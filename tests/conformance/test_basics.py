"""Basics: state schemas, reducers, edges, entry/finish points, sequences, async nodes."""

from __future__ import annotations

import asyncio
import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import pytest
from pydantic import BaseModel

from .harness import Conform, attempt, collect
from .impls import Impl

pytestmark = pytest.mark.conformance


class Plain(TypedDict):
    value: str
    count: int


class Listy(TypedDict):
    items: Annotated[list[str], operator.add]
    last: str


def _suffix(tag: str) -> Any:
    """A node appending `tag` to `value` and bumping `count`."""

    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"value": state["value"] + tag, "count": state["count"] + 1}

    node.__name__ = f"node_{tag}"
    return node


def linear(impl: Impl) -> Any:
    b = impl.StateGraph(Plain)
    for name in "abc":
        b.add_node(name, _suffix(name))
    b.add_edge(impl.START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", impl.END)
    g = impl.compile(b)
    inp = {"value": "x", "count": 0}
    return {
        "invoke": g.invoke(inp),
        "values": list(g.stream(inp, stream_mode="values")),
        "updates": list(g.stream(inp, stream_mode="updates")),
    }


def test_linear(conform: Conform) -> None:
    conform(linear)


@dataclass
class DcState:
    name: str
    tags: Annotated[list[str], operator.add] = field(default_factory=list)
    score: int = 0


def dataclass_state(impl: Impl) -> Any:
    def first(state: DcState) -> dict[str, Any]:
        return {"tags": [f"first:{state.name}:{type(state).__name__}"], "score": state.score + 1}

    def second(state: DcState) -> dict[str, Any]:
        return {"tags": [f"second:{len(state.tags)}"], "score": state.score * 10}

    b = impl.StateGraph(DcState)
    b.add_node("first", first)
    b.add_node("second", second)
    b.add_edge(impl.START, "first")
    b.add_edge("first", "second")
    g = impl.compile(b)
    return {
        "from_dict": g.invoke({"name": "n"}),
        "from_instance": g.invoke(DcState(name="m", tags=["t0"], score=2)),
        "updates": list(g.stream({"name": "u"}, stream_mode="updates")),
    }


def test_dataclass_state(conform: Conform) -> None:
    conform(dataclass_state)


class PydState(BaseModel):
    query: str
    hits: Annotated[list[int], operator.add] = []
    note: str | None = None


def pydantic_state(impl: Impl) -> Any:
    def search(state: PydState) -> dict[str, Any]:
        return {"hits": [len(state.query)], "note": type(state).__name__}

    def rank(state: PydState) -> dict[str, Any]:
        return {"hits": [sum(state.hits) * 2]}

    b = impl.StateGraph(PydState)
    b.add_node("search", search)
    b.add_node("rank", rank)
    b.add_edge(impl.START, "search")
    b.add_edge("search", "rank")
    g = impl.compile(b)
    return {
        "invoke": g.invoke({"query": "abc"}),
        "from_model": g.invoke(PydState(query="hello", hits=[1])),
        "values": list(g.stream({"query": "q"}, stream_mode="values")),
    }


def test_pydantic_state(conform: Conform) -> None:
    conform(pydantic_state)


class InSchema(TypedDict):
    question: str


class OutSchema(TypedDict):
    answer: str


class FullSchema(TypedDict):
    question: str
    scratch: str
    answer: str


def input_output_schemas(impl: Impl) -> Any:
    seen: list[Any] = []

    def think(state: InSchema) -> dict[str, Any]:
        seen.append(sorted(state))
        return {"scratch": state["question"].upper()}

    def reply(state: FullSchema) -> dict[str, Any]:
        return {"answer": state["scratch"] + "!"}

    b = impl.StateGraph(FullSchema, input_schema=InSchema, output_schema=OutSchema)
    b.add_node("think", think)
    b.add_node("reply", reply)
    b.add_edge(impl.START, "think")
    b.add_edge("think", "reply")
    g = impl.compile(b)
    inp = {"question": "why", "scratch": "ignored", "other": 1}
    return {
        "invoke": g.invoke(inp),
        "values": list(g.stream(inp, stream_mode="values")),
        "updates": list(g.stream(inp, stream_mode="updates")),
        "node_saw": seen,
    }


def test_input_output_schemas(conform: Conform) -> None:
    conform(input_output_schemas)


def _keep_longest(left: str | None, right: str) -> str:
    """A custom reducer: keep whichever string is longer (left on ties)."""
    if left is None or len(right) > len(left):
        return right
    return left


class Reduced(TypedDict):
    log: Annotated[list[str], operator.add]
    total: Annotated[int, operator.add]
    longest: Annotated[str, _keep_longest]


def reducers(impl: Impl) -> Any:
    def fan(tag: str) -> Any:
        def node(state: Reduced) -> dict[str, Any]:
            return {"log": [tag], "total": len(tag), "longest": tag * 2}

        return node

    b = impl.StateGraph(Reduced)
    for tag in ("a", "bb", "ccc"):
        b.add_node(tag, fan(tag))
        b.add_edge(impl.START, tag)
    b.add_node("join", lambda s: {"log": [f"join:{len(s['log'])}"], "total": 100})
    b.add_edge(["a", "bb", "ccc"], "join")
    g = impl.compile(b)
    return {
        "invoke": g.invoke({"log": ["start"], "total": 1, "longest": "zz"}),
        "values": list(g.stream({"log": [], "total": 0}, stream_mode="values")),
    }


def test_reducers(conform: Conform) -> None:
    conform(reducers)


def messages_state(impl: Impl) -> Any:
    def bot(state: dict[str, Any]) -> dict[str, Any]:
        last = state["messages"][-1]
        return {"messages": [{"role": "assistant", "content": f"echo {last.content}"}]}

    def edit(state: dict[str, Any]) -> dict[str, Any]:
        first = state["messages"][0]
        replaced = {"role": "user", "content": "edited", "id": first.id}
        return {"messages": [replaced, {"role": "user", "content": "more", "id": "m-9"}]}

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("bot", bot)
    b.add_node("edit", edit)
    b.add_edge(impl.START, "bot")
    b.add_edge("bot", "edit")
    g = impl.compile(b)
    out = g.invoke({"messages": [{"role": "user", "content": "hi", "id": "m-1"}]})
    merged = impl.add_messages(
        [{"role": "user", "content": "a", "id": "1"}],
        [
            {"role": "assistant", "content": "b", "id": "2"},
            {"role": "user", "content": "A", "id": "1"},
        ],
    )
    return {"invoke": out, "add_messages": merged}


def test_messages_state(conform: Conform) -> None:
    conform(messages_state)


def add_sequence(impl: Impl) -> Any:
    def step_one(state: Plain) -> dict[str, Any]:
        return {"value": state["value"] + "1", "count": state["count"] + 1}

    def step_two(state: Plain) -> dict[str, Any]:
        return {"value": state["value"] + "2", "count": state["count"] + 1}

    b = impl.StateGraph(Plain)
    b.add_sequence([step_one, step_two, ("three", _suffix("3"))])
    b.add_edge(impl.START, "step_one")
    g = impl.compile(b)
    inp = {"value": "s", "count": 0}
    return {"invoke": g.invoke(inp), "updates": list(g.stream(inp, stream_mode="updates"))}


def test_add_sequence(conform: Conform) -> None:
    conform(add_sequence)


def entry_finish_points(impl: Impl) -> Any:
    b = impl.StateGraph(Plain)
    b.add_node("first", _suffix("f"))
    b.add_node("last", _suffix("l"))
    b.add_edge("first", "last")
    b.set_entry_point("first")
    b.set_finish_point("last")
    g = impl.compile(b)

    c = impl.StateGraph(Plain)
    c.add_node("small", _suffix("s"))
    c.add_node("big", _suffix("B"))
    c.set_conditional_entry_point(lambda s: "big" if s["count"] > 5 else "small")
    c.set_finish_point("small")
    c.set_finish_point("big")
    h = impl.compile(c)
    return {
        "fixed": g.invoke({"value": "", "count": 0}),
        "cond_small": h.invoke({"value": "", "count": 1}),
        "cond_big": h.invoke({"value": "", "count": 9}),
    }


def test_entry_finish_points(conform: Conform) -> None:
    conform(entry_finish_points)


def conditional_path_map_dict(impl: Impl) -> Any:
    def route(state: Plain) -> str:
        return "again" if state["count"] < 3 else "done"

    b = impl.StateGraph(Plain)
    b.add_node("work", _suffix("w"))
    b.add_node("wrap", _suffix("!"))
    b.add_edge(impl.START, "work")
    b.add_conditional_edges("work", route, {"again": "work", "done": "wrap"})
    b.add_edge("wrap", impl.END)
    g = impl.compile(b)
    inp = {"value": "", "count": 0}
    return {
        "invoke": g.invoke(inp),
        "updates": list(g.stream(inp, stream_mode="updates")),
        "late": g.invoke({"value": "", "count": 7}),
    }


def test_conditional_path_map_dict(conform: Conform) -> None:
    conform(conditional_path_map_dict)


def conditional_path_map_list(impl: Impl) -> Any:
    def route(state: Listy) -> list[str]:
        return ["left", "right"] if state["last"] == "both" else [state["last"]]

    def mark(tag: str) -> Any:
        return lambda s: {"items": [tag], "last": tag}

    b = impl.StateGraph(Listy)
    b.add_node("start", lambda s: {"items": ["start"]})
    b.add_node("left", mark("left"))
    b.add_node("right", lambda s: {"items": ["right"]})
    b.add_edge(impl.START, "start")
    b.add_conditional_edges("start", route, ["left", "right"])
    g = impl.compile(b)
    return {
        "both": g.invoke({"items": [], "last": "both"}),
        "one": g.invoke({"items": [], "last": "right"}),
        "end": attempt(g.invoke, {"items": [], "last": impl.END}),
        "graph_nodes": sorted(g.get_graph().nodes),
    }


def test_conditional_path_map_list(conform: Conform) -> None:
    conform(conditional_path_map_list)


def async_nodes(impl: Impl) -> Any:
    async def fetch(state: Listy) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"items": ["fetch"], "last": "fetch"}

    async def parse(state: Listy) -> dict[str, Any]:
        return {"items": [f"parse:{len(state['items'])}"]}

    def sync_tail(state: Listy) -> dict[str, Any]:
        return {"last": "tail"}

    b = impl.StateGraph(Listy)
    b.add_node("fetch", fetch)
    b.add_node("parse", parse)
    b.add_node("tail", sync_tail)
    b.add_edge(impl.START, "fetch")
    b.add_edge("fetch", "parse")
    b.add_edge("parse", "tail")
    g = impl.compile(b)

    async def run() -> Any:
        inp = {"items": ["in"], "last": ""}
        chunks = [c async for c in g.astream(inp, stream_mode=["values", "updates"])]
        return {"ainvoke": await g.ainvoke(inp), "astream": chunks}

    return asyncio.run(run())


def test_async_nodes(conform: Conform) -> None:
    conform(async_nodes)


def empty_updates(impl: Impl) -> Any:
    b = impl.StateGraph(Plain)
    b.add_node("noop", lambda s: None)
    b.add_node("empty", lambda s: {})
    b.add_node("real", _suffix("r"))
    b.add_edge(impl.START, "noop")
    b.add_edge("noop", "empty")
    b.add_edge("empty", "real")
    g = impl.compile(b)
    inp = {"value": "", "count": 0}
    return {
        "updates": list(g.stream(inp, stream_mode="updates")),
        "values": list(g.stream(inp, stream_mode="values")),
        "partial_input": attempt(g.invoke, {"value": "only"}),
    }


def test_empty_updates(conform: Conform) -> None:
    conform(empty_updates)


def non_dict_update(impl: Impl) -> Any:
    # An update to a key the schema lacks is not observed here: LangGraph drops it silently,
    # bulksync raises on purpose (DESIGN.md §1, "Clear errors").
    b = impl.StateGraph(Plain)
    b.add_node("wrong_type", lambda s: "not a dict")
    b.add_edge(impl.START, "wrong_type")
    g = impl.compile(b)
    inp = {"value": "", "count": 0}
    return {"invoke": attempt(g.invoke, inp), "stream": collect(g.stream(inp))}


def test_non_dict_update(conform: Conform) -> None:
    conform(non_dict_update)
