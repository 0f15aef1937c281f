"""What LangGraph lets through, and real programs rely on: bulksync's default does the same.

An update key outside the schema is dropped, a ``Send`` or goto to an unknown node is
skipped, a node nothing routes to still compiles, and the debug stream of a graph without a
checkpointer shows no checkpoints. (``compile(strict=True)`` turns the first three into errors;
unit tests under tests/unit/graph cover that mode.)
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def unknown_update_keys_are_dropped(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("extra", lambda s: {"log": ["extra"], "not_a_key": 1})
    b.add_node("command", lambda s: impl.Command(update={"log": ["cmd"], "nope": 2}))
    b.add_edge(impl.START, "extra")
    b.add_edge("extra", "command")
    g = impl.compile(b)
    return {"invoke": g.invoke({"log": []}), "updates": list(g.stream({"log": []}))}


def test_unknown_update_keys_are_dropped(conform: Conform) -> None:
    conform(unknown_update_keys_are_dropped)


def unknown_destinations_are_skipped(impl: Impl) -> Any:
    def route(state: State) -> list[Any]:
        return [impl.Send("ghost", {}), impl.Send("work", {"log": ["sent"]})]

    b = impl.StateGraph(State)
    b.add_node("work", lambda s: impl.Command(update={"log": ["work"]}, goto=["phantom"]))
    b.add_conditional_edges(impl.START, route)
    g = impl.compile(b)
    return g.invoke({"log": []})


def test_unknown_destinations_are_skipped(conform: Conform) -> None:
    conform(unknown_destinations_are_skipped)


def unreachable_node_compiles(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("used", lambda s: {"log": ["used"]})
    b.add_node("island", lambda s: {"log": ["island"]})
    b.add_edge(impl.START, "used")
    return impl.compile(b).invoke({"log": []})


def test_unreachable_node_compiles(conform: Conform) -> None:
    conform(unreachable_node_compiles)


def debug_stream_without_checkpointer(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("one", lambda s: {"log": ["one"]})
    b.add_edge(impl.START, "one")
    chunks = list(impl.compile(b).stream({"log": []}, stream_mode=["debug", "checkpoints"]))
    return [(mode, chunk["type"] if mode == "debug" else None) for mode, chunk in chunks]


def test_debug_stream_without_checkpointer(conform: Conform) -> None:
    conform(debug_stream_without_checkpointer)
