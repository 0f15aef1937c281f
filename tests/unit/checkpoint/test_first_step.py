"""A run's input checkpoint and its first step's: stored together where the saver can.

The step after an input maps it to the state's channels (``START``, no user code). A saver
with ``put_steps`` stores the input checkpoint with that step's checkpoint in one
transaction; before any user code runs from it, and on any stop between the two, the input
checkpoint is stored on its own. Either way the history is LangGraph's.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver as LangGraphSaver
from langgraph.graph import END as LG_END
from langgraph.graph import START as LG_START
from langgraph.graph import StateGraph as LangGraphStateGraph

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.constants import END, START
from bulksync.errors import InvalidUpdateError
from bulksync.graph import StateGraph
from tests.unit.checkpoint.conftest import _postgres_saver


@pytest.fixture
def postgres() -> Iterator[PostgresSaver]:
    """A PostgresSaver on a fresh schema (skips without Postgres, fails under ``CI``)."""
    yield from _postgres_saver()


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def line(api: tuple[Any, Any, Any], *, route: Any = None) -> Any:
    """START -> a -> END; with ``route``, a conditional edge from START (user code) to a."""
    graph_class, start, end = api
    builder = graph_class(State)
    builder.add_node("a", lambda state: {"log": ["a"]})
    if route is None:
        builder.add_edge(start, "a")
    else:
        builder.add_conditional_edges(start, route, ["a"])
    builder.add_edge("a", end)
    return builder


BULKSYNC = (StateGraph, START, END)
LANGGRAPH = (LangGraphStateGraph, LG_START, LG_END)


def history(graph: Any, config: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (s.metadata["source"], s.metadata["step"], s.next, s.values)
        for s in graph.get_state_history(config)
    ]


def record_put_steps(saver: PostgresSaver) -> list[list[str]]:
    """The sources of the checkpoints each ``put_steps`` (or ``put_steps_soon``) call
    stores, call by call."""
    calls: list[list[str]] = []

    def recorded(put: Any) -> Any:
        def recording(steps: Any) -> Any:
            calls.append([metadata["source"] for _, _, _, metadata, _ in steps])
            return put(steps)

        return recording

    saver.put_steps = recorded(saver.put_steps)  # type: ignore[method-assign]
    saver.put_steps_soon = recorded(saver.put_steps_soon)  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("route", [None, "route"])
def test_the_history_is_langgraphs(saver: CheckpointSaver, route: Any) -> None:
    def to_a(state: State) -> str:
        return "a"

    config = {"configurable": {"thread_id": "t"}}
    router = to_a if route else None
    ours = line(BULKSYNC, route=router).compile(checkpointer=saver)
    theirs = line(LANGGRAPH, route=router).compile(checkpointer=LangGraphSaver())
    for graph in (ours, theirs):
        graph.invoke({"log": ["in"]}, config, durability="sync")
        graph.invoke({"log": ["again"]}, config, durability="sync")  # a thread with a head
    assert history(ours, config) == history(theirs, config)


def test_postgres_stores_the_input_checkpoint_with_the_first_steps(
    postgres: PostgresSaver,
) -> None:
    calls = record_put_steps(postgres)
    graph = line(BULKSYNC).compile(checkpointer=postgres)
    graph.invoke({"log": ["in"]}, {"configurable": {"thread_id": "t"}}, durability="sync")
    assert calls == [["input", "loop"], ["loop"]]


def test_user_code_in_the_first_step_starts_from_a_stored_input_checkpoint(
    postgres: PostgresSaver,
) -> None:
    config = {"configurable": {"thread_id": "t"}}
    seen: list[str] = []

    def route(state: State) -> str:  # a conditional edge from START is the user's code
        head = postgres.get_tuple(config)
        seen.append(head.metadata["source"] if head is not None else "nothing")
        return "a"

    calls = record_put_steps(postgres)
    graph = line(BULKSYNC, route=route).compile(checkpointer=postgres)
    graph.invoke({"log": ["in"]}, config, durability="sync")
    assert seen == ["input"]
    assert calls == [["input"], ["loop"], ["loop"]]


def test_a_failing_first_step_leaves_the_input_checkpoint_and_its_error(
    saver: CheckpointSaver,
) -> None:
    config = {"configurable": {"thread_id": "t"}}
    ours = line(BULKSYNC).compile(checkpointer=saver)
    theirs = line(LANGGRAPH).compile(checkpointer=LangGraphSaver())
    with pytest.raises(InvalidUpdateError, match="Expected dict, got 5"):
        ours.invoke(5, config, durability="sync")
    with pytest.raises(Exception, match="Expected dict, got 5"):
        theirs.invoke(5, config, durability="sync")
    assert history(ours, config) == history(theirs, config) != []
    (task,) = ours.get_state(config).tasks
    assert task.name == START and "Expected dict, got 5" in str(task.error)
