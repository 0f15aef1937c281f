"""get_subgraphs / aget_subgraphs: the subgraphs added as nodes, named as LangGraph names them."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

lg_graph = pytest.importorskip("langgraph.graph")


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _nested(graph_module: Any) -> Any:
    def leaf(name: str) -> Any:
        b = graph_module.StateGraph(State)
        b.add_node(name, lambda s: {"log": [name]})
        b.add_edge(graph_module.START, name)
        return b.compile()

    middle = graph_module.StateGraph(State)
    middle.add_node("inner", leaf("x"))
    middle.add_edge(graph_module.START, "inner")
    outer = graph_module.StateGraph(State)
    outer.add_node("plain", lambda s: {"log": ["p"]})
    outer.add_node("mid", middle.compile())
    outer.add_node("other", leaf("y"))
    outer.add_edge(graph_module.START, "plain")
    outer.add_edge("plain", "mid")
    outer.add_edge("mid", "other")
    return outer.compile()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"recurse": True}, {"namespace": "mid"}, {"namespace": "mid|inner"}, {"namespace": "x"}],
    ids=repr,
)
def test_subgraphs_are_named_as_in_langgraph(kwargs: dict[str, Any]) -> None:
    from bulksync import graph as bs_graph

    ours = [name for name, _ in _nested(bs_graph).get_subgraphs(**kwargs)]
    assert ours == [name for name, _ in _nested(lg_graph).get_subgraphs(**kwargs)]


def test_the_async_twin_gives_the_same() -> None:
    from bulksync import graph as bs_graph

    graph = _nested(bs_graph)

    async def names() -> list[str]:
        return [name async for name, _ in graph.aget_subgraphs(recurse=True)]

    assert asyncio.run(names()) == [name for name, _ in graph.get_subgraphs(recurse=True)]


def test_a_namespace_matches_whole_segments_only() -> None:
    from bulksync.graph import START, StateGraph

    class S(TypedDict):
        x: int

    def sub() -> Any:
        return StateGraph(S).add_node("n", lambda s: s).add_edge(START, "n").compile()

    parent = (
        StateGraph(S)
        .add_node("research", sub())
        .add_node("research_review", sub())
        .add_edge(START, "research")
        .add_edge(START, "research_review")
        .compile()
    )
    assert [n for n, _ in parent.get_subgraphs(namespace="research_review")] == ["research_review"]
    assert [n for n, _ in parent.get_subgraphs(namespace="research")] == ["research"]
