"""LangChain callbacks of a run: the graph a chain run, each task a child, what a node calls
nested under its task; errors reported where they happen."""

from __future__ import annotations

from typing import Any, TypedDict
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManager
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

from bulksync.graph import START, MessagesState, StateGraph
from bulksync.workers.tracing import with_handlers


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.runs: dict[UUID, tuple[str, UUID | None]] = {}
        self.ends: list[str] = []
        self.errors: list[tuple[str, str]] = []

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kw: Any) -> None:
        self.runs[run_id] = (kw["name"], kw.get("parent_run_id"))

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kw: Any
    ) -> None:
        self.runs[run_id] = ("chat_model", kw.get("parent_run_id"))

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kw: Any) -> None:
        self.ends.append(self.runs[run_id][0])

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
        self.errors.append((self.runs[run_id][0], type(error).__name__))

    def tree(self) -> list[tuple[str, str | None]]:
        return [
            (name, self.runs[p][0] if p in self.runs else None) for name, p in self.runs.values()
        ]


class State(TypedDict):
    value: int


def test_tasks_and_what_they_call_nest_under_the_graph_run() -> None:
    model = GenericFakeChatModel(messages=iter(["hi"]))

    def talk(state: Any) -> dict[str, Any]:
        return {"messages": model.invoke(state["messages"])}

    graph = StateGraph(MessagesState).add_node("talk", talk).add_edge(START, "talk").compile()
    recorder = Recorder()
    graph.invoke({"messages": "yo"}, {"callbacks": [recorder]})
    assert recorder.tree() == [("LangGraph", None), ("talk", "LangGraph"), ("chat_model", "talk")]
    assert recorder.ends == ["talk", "LangGraph"]


def test_a_failing_node_reports_its_error_on_its_run_and_the_graph_run() -> None:
    def broken(state: State) -> dict[str, Any]:
        raise ValueError("broke")

    graph = StateGraph(State).add_node("broken", broken).add_edge(START, "broken").compile()
    recorder = Recorder()
    with pytest.raises(ValueError, match="broke"):
        graph.invoke({"value": 1}, {"callbacks": [recorder]})
    assert recorder.errors == [("broken", "ValueError"), ("LangGraph", "ValueError")]


def test_an_interrupted_run_reports_the_interruption_on_the_graph_run() -> None:
    """``invoke`` runs the loop on its caller's thread: Ctrl-C there (here raised by the
    node, which runs on that thread) ends the run, reported as it is raised."""

    def stopped(state: State) -> dict[str, Any]:
        raise KeyboardInterrupt

    graph = StateGraph(State).add_node("stop", stopped).add_edge(START, "stop").compile()
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        graph.invoke({"value": 1}, {"callbacks": [recorder]})
    assert ("LangGraph", "KeyboardInterrupt") in recorder.errors


def test_a_graph_a_node_streams_with_its_config_runs_to_the_end() -> None:
    """The node's config carries a callback manager (not a list): the inner run's tasks get
    their stream handlers added to it."""
    model = GenericFakeChatModel(messages=iter(["nested"]))

    def call_model(state: Any) -> dict[str, Any]:
        return {"messages": model.invoke(state["messages"])}

    inner = StateGraph(MessagesState).add_node("m", call_model).add_edge(START, "m").compile()

    def outer_node(state: State, config: Any) -> dict[str, Any]:
        chunks = list(inner.stream({"messages": "hi"}, config, stream_mode="messages"))
        return {"value": len(chunks)}

    outer = StateGraph(State).add_node("outer", outer_node).add_edge(START, "outer").compile()
    recorder = Recorder()
    assert outer.invoke({"value": 0}, {"callbacks": [recorder]})["value"] > 0
    assert ("m", "LangGraph") in recorder.tree()


def test_handlers_join_lists_and_managers() -> None:
    extra = Recorder()
    assert with_handlers(None, [extra]) == [extra]
    assert with_handlers([], []) == []
    manager = CallbackManager.configure(inheritable_callbacks=[Recorder()])
    joined = with_handlers(manager, [extra])
    assert extra in joined.inheritable_handlers and extra not in manager.handlers
