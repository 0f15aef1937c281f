"""Engine-level bad-input errors: each names the thing at fault and says what to do."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.config import get_stream_writer
from bulksync.errors import (
    EmptyInputError,
    InvalidGraphError,
    InvalidUpdateError,
    SerializationError,
)
from bulksync.graph import END, START, StateGraph
from bulksync.graph.branch import warn_once
from bulksync.graph.compiled import CompiledStateGraph
from bulksync.types import Command, Send, interrupt


class State(TypedDict):
    """One plain key and one appending key."""

    x: int
    log: Annotated[list[str], operator.add]


def _bump(state: State) -> dict[str, Any]:
    return {"x": state["x"] + 1, "log": ["bump"]}


def _linear(checkpointer: Any = None) -> CompiledStateGraph:
    builder = StateGraph(State)
    builder.add_node("bump", _bump)
    builder.add_edge(START, "bump")
    builder.add_edge("bump", END)
    return builder.compile(checkpointer=checkpointer)


def _thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def test_checkpointer_without_thread_id_asks_for_thread_id() -> None:
    graph = _linear(InMemorySaver())
    with pytest.raises(ValueError, match=r"thread_id"):
        graph.invoke({"x": 0, "log": []})


def test_resume_without_checkpointer_asks_for_checkpointer() -> None:
    graph = _linear()
    with pytest.raises(RuntimeError, match=r"without checkpointer.*checkpointer=") as info:
        graph.invoke(Command(resume="yes"))
    assert "Command(resume=...)" in str(info.value)


@pytest.mark.parametrize("limit", [0, "x"])
def test_bad_recursion_limit_is_rejected(limit: Any) -> None:
    graph = _linear()
    with pytest.raises(ValueError, match=r"[Rr]ecursion limit.*>= 1") as info:
        graph.invoke({"x": 0, "log": []}, {"recursion_limit": limit})
    assert repr(limit) in str(info.value)


def _bad_reducer(left: list[Any], right: list[Any]) -> list[Any]:
    return [1 // 0]


class ReducerState(TypedDict):
    """A key whose reducer always fails."""

    items: Annotated[list[Any], _bad_reducer]


def test_failing_reducer_keeps_its_type_and_notes_key_and_node() -> None:
    builder = StateGraph(ReducerState)
    builder.add_node("writer", lambda state: {"items": [1]})
    builder.add_edge(START, "writer")
    builder.add_edge("writer", END)
    graph = builder.compile()
    with pytest.raises(ZeroDivisionError) as info:
        graph.invoke({})
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "'items'" in notes
    assert "writer" in notes
    assert "fix the reducer" in notes


class AnyState(TypedDict):
    """A plain last-value key that accepts anything."""

    blob: Any


def test_unserializable_value_names_node_channel_and_type() -> None:
    class Opaque:
        pass

    builder = StateGraph(AnyState)
    builder.add_node("maker", lambda state: {"blob": Opaque()})
    builder.add_edge(START, "maker")
    builder.add_edge("maker", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    with pytest.raises(SerializationError, match=r"node 'maker', channel 'blob'") as info:
        graph.invoke({"blob": 1}, _thread("serde"))
    assert isinstance(info.value, TypeError)
    assert "Opaque' has no msgpack encoding" in str(info.value)


def _sends_to_a_ghost() -> StateGraph[State]:
    builder = StateGraph(State)
    builder.add_node("bump", _bump)
    builder.add_conditional_edges(START, lambda state: [Send("ghost", state), Send("bump", state)])
    builder.add_edge("bump", END)
    return builder


def test_send_to_unknown_node_names_the_node_when_strict() -> None:
    graph = _sends_to_a_ghost().compile(strict=True)
    with pytest.raises(InvalidGraphError, match=r"unknown node 'ghost'.*add_node"):
        graph.invoke({"x": 0, "log": []})


def test_strict_comes_from_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULKSYNC_STRICT", "1")
    with pytest.raises(InvalidGraphError, match=r"unknown node 'ghost'"):
        _sends_to_a_ghost().compile().invoke({"x": 0, "log": []})
    assert _sends_to_a_ghost().compile(strict=False).invoke({"x": 0, "log": []})["x"] == 1


def test_send_to_unknown_node_is_skipped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    warn_once.cache_clear()  # once per process: forget what earlier tests were told
    graph = _sends_to_a_ghost().compile()
    for _ in range(2):
        assert graph.invoke({"x": 0, "log": []})["x"] == 1  # as LangGraph: bump ran, ghost not
    warned = [r.getMessage() for r in caplog.records if "'ghost'" in r.getMessage()]
    assert len(warned) == 1 and "strict=True" in warned[0], warned


def _typo_graph(**compile_kw: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("typo", lambda state: {"x": 1, "y": 1})
    builder.add_edge(START, "typo")
    builder.add_edge("typo", END)
    return builder.compile(**compile_kw)


def test_update_with_unknown_key_names_node_and_key_when_strict() -> None:
    with pytest.raises(InvalidUpdateError, match=r"typo") as info:
        _typo_graph(strict=True).invoke({"x": 0, "log": []})
    assert "'y'" in str(info.value)
    assert "Add 'y' to the state schema" in str(info.value)


def test_update_with_unknown_key_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _typo_graph().invoke({"x": 0, "log": []}) == {"x": 1, "log": []}
    assert any("'y'" in r.getMessage() and "Ignored" in r.getMessage() for r in caplog.records)


def test_none_input_on_fresh_thread_is_empty_input() -> None:
    graph = _linear(InMemorySaver())
    with pytest.raises(EmptyInputError, match=r"pass an input"):
        graph.invoke(None, _thread("fresh"))


def test_graph_without_entry_point_fails_at_compile() -> None:
    builder = StateGraph(State)
    builder.add_node("bump", _bump)
    builder.add_edge("bump", END)
    with pytest.raises(InvalidGraphError, match=r"entrypoint: add at least one edge from START"):
        builder.compile()


def _asker(question: str) -> Any:
    def node(state: State) -> dict[str, Any]:
        answer = interrupt(question)
        return {"log": [f"{question}={answer}"]}

    return node


def test_plain_resume_with_two_pending_interrupts_asks_for_interrupt_id() -> None:
    builder = StateGraph(State)
    builder.add_node("ask_a", _asker("a"))
    builder.add_node("ask_b", _asker("b"))
    builder.add_edge(START, "ask_a")
    builder.add_edge(START, "ask_b")
    builder.add_edge("ask_a", END)
    builder.add_edge("ask_b", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config = _thread("two")
    graph.invoke({"x": 0, "log": []}, config)
    assert len(graph.get_state(config).interrupts) == 2
    with pytest.raises(RuntimeError, match=r"interrupt id"):
        graph.invoke(Command(resume="yes"), config)


def test_stream_writer_outside_a_node_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"outside a running graph node"):
        get_stream_writer()


def test_node_error_keeps_its_type_and_notes_node_and_task() -> None:
    def lookup(state: State) -> dict[str, Any]:
        return {"x": {}["missing"]}

    builder = StateGraph(State)
    builder.add_node("lookup", lookup)
    builder.add_edge(START, "lookup")
    graph = builder.compile()
    with pytest.raises(KeyError) as info:
        graph.invoke({"x": 0})
    (note,) = getattr(info.value, "__notes__", [])
    assert note.startswith("During task with name 'lookup' and id '")  # LangGraph's words


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"durability": "sometimes"}, "durability='sometimes'"),
        ({"interrupt_before": ["nope"]}, "interrupt_before names no node"),
        ({"interrupt_after": ["nope"]}, "interrupt_after names no node"),
    ],
)
def test_run_arguments_langgraph_accepts_are_run_and_logged(
    options: dict[str, Any], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    # LangGraph runs these as if they were not given; so does bulksync, and says so.
    graph = _linear(InMemorySaver())
    with caplog.at_level("WARNING", logger="bulksync.graph"):
        out = graph.invoke({"x": 0}, _thread("lenient"), **options)
    assert out == graph.invoke({"x": 0}, _thread("plain"))
    assert any(named in r.getMessage() for r in caplog.records), caplog.text


def test_unknown_interrupt_node_at_compile_is_langgraphs_value_error() -> None:
    builder = StateGraph(State)
    builder.add_node("bump", _bump)
    builder.add_edge(START, "bump")
    with pytest.raises(ValueError, match="Interrupt node `nope` not found"):
        builder.compile(interrupt_before=["nope"])
