"""Finding the graph a node's function invokes, by reading the function."""

from __future__ import annotations

from typing import Any, TypedDict

from bulksync.graph import START, StateGraph
from bulksync.graph.invoked import invoked_graph


class S(TypedDict):
    x: int


def _graph() -> Any:
    return StateGraph(S).add_node("n", lambda s: s).add_edge(START, "n").compile()


GLOBAL_GRAPH = _graph()


def uses_the_global(state: S) -> Any:
    return GLOBAL_GRAPH.invoke(state)


def test_a_global_a_closure_and_a_nested_function_are_found() -> None:
    local = _graph()

    def uses_the_closure(state: S) -> Any:
        return local.invoke(state)

    def nests(state: S) -> Any:
        def inner() -> Any:
            return GLOBAL_GRAPH.invoke(state)

        return inner()

    assert invoked_graph(uses_the_global) is GLOBAL_GRAPH
    assert invoked_graph(uses_the_closure) is local
    assert invoked_graph(nests) is GLOBAL_GRAPH


def test_none_or_several_graphs_or_no_code_find_nothing() -> None:
    other = _graph()

    def two(state: S) -> Any:
        return other.invoke(GLOBAL_GRAPH.invoke(state))

    assert invoked_graph(two) is None
    assert invoked_graph(lambda s: s) is None
    assert invoked_graph(print) is None
