"""Node error handlers: ``add_node(error_handler=...)`` and ``StateGraph.set_node_defaults``.

A node that fails for good (its retries spent) has its handler run in its place; the
handler's update or ``Command`` is applied, and the run goes on. A handler's own failure
fails the run.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import pytest

from .harness import Conform, attempt, collect
from .impls import Impl

if TYPE_CHECKING:  # handlers declare it by name: LangGraph injects a parameter so annotated
    from bulksync.errors import NodeError

pytestmark = pytest.mark.conformance


class State(TypedDict):
    route: str
    log: Annotated[list[str], operator.add]


def _fail_a(state: State) -> State:
    raise RuntimeError("a failed")


def _fail_b(state: State) -> State:
    raise ValueError("b failed")


def node_and_default_handlers(impl: Impl) -> Any:
    """The node's own handler wins over the default one; both get the failure's node and
    error; a handler's update streams as the failed node's."""

    def own(state: State, error: NodeError) -> dict[str, Any]:
        return {"log": [f"own:{error.node}:{error.error}"]}

    def fallback(state: State, error: NodeError) -> dict[str, Any]:
        return {"log": [f"default:{error.node}:{type(error.error).__name__}"]}

    b = impl.StateGraph(State).set_node_defaults(error_handler=fallback)
    b.add_node("route", lambda s: {"log": ["routed"]})
    b.add_node("fail_a", _fail_a, error_handler=own)
    b.add_node("fail_b", _fail_b)
    b.add_edge(impl.START, "route")
    b.add_conditional_edges("route", lambda s: s["route"], ["fail_a", "fail_b"])
    graph = impl.compile(b)
    return {
        "a": graph.invoke({"route": "fail_a", "log": []}),
        "b": collect(graph.stream({"route": "fail_b", "log": []}, stream_mode="updates")),
    }


def test_node_and_default_handlers(conform: Conform) -> None:
    conform(node_and_default_handlers)


def handler_routes_with_command(impl: Impl) -> Any:
    """A handler's ``Command`` goes where it says; retries are spent before it runs."""
    tries = {"n": 0}

    def flaky(state: State) -> State:
        tries["n"] += 1
        raise ValueError("always")

    def handler(state: State) -> Any:
        return impl.Command(update={"log": [f"handled after {tries['n']}"]}, goto="after")

    b = impl.StateGraph(State)
    retry = impl.RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False)
    b.add_node("flaky", flaky, retry_policy=retry, error_handler=handler)
    b.add_node("after", lambda s: {"log": ["after"]})
    b.add_edge(impl.START, "flaky")
    graph = impl.compile(b, checkpointer=impl.saver())
    thread = {"configurable": {"thread_id": "route"}}
    return {
        "out": graph.invoke({"route": "", "log": []}, thread),
        "next": graph.get_state(thread).next,
        "steps": len(list(graph.get_state_history(thread))),
    }


def test_handler_routes_with_command(conform: Conform) -> None:
    conform(handler_routes_with_command)


def failing_handler_fails_the_run(impl: Impl) -> Any:
    """A handler that raises fails the run with its own error; interrupts are not errors."""

    def broken(state: State) -> State:
        raise KeyError("handler broke")

    def asks(state: State) -> State:
        return {"log": [impl.interrupt("why?")]}

    b = impl.StateGraph(State)
    b.add_node("fail_a", _fail_a, error_handler=broken)
    b.add_edge(impl.START, "fail_a")
    c = impl.StateGraph(State).set_node_defaults(error_handler=broken)
    c.add_node("asks", asks)
    c.add_edge(impl.START, "asks")
    asking = impl.compile(c, checkpointer=impl.saver())
    thread = {"configurable": {"thread_id": "asks"}}
    return {
        "error": attempt(lambda: impl.compile(b).invoke({"route": "", "log": []})),
        "paused": asking.invoke({"route": "", "log": []}, thread),
        "resumed": asking.invoke(impl.Command(resume="because"), thread),
    }


def test_failing_handler_fails_the_run(conform: Conform) -> None:
    conform(failing_handler_fails_the_run)


def resumed_after_a_crashed_handler(impl: Impl) -> Any:
    """A handler that crashed runs again when the run resumes; the failed node does not,
    and the handler gets the node's failure back from the checkpoint."""
    runs: list[str] = []
    crash = [True]

    def handler(state: State, error: NodeError) -> dict[str, Any]:
        runs.append(f"handler:{error.node}")
        if crash[0]:
            raise KeyError("handler crashed")
        return {"log": [f"handled {error.node}: {'a failed' in str(error.error)}"]}

    def failing(state: State) -> State:
        runs.append("fail_a")
        return _fail_a(state)

    def sibling(state: State) -> dict[str, Any]:
        runs.append("ok")  # once: finished before the failure, or run when resumed
        return {"log": ["ok"]}

    b = impl.StateGraph(State)
    b.add_node("fail_a", failing, error_handler=handler)
    b.add_node("ok", sibling)
    b.add_edge(impl.START, "fail_a")
    b.add_edge(impl.START, "ok")
    graph = impl.compile(b, checkpointer=impl.saver())
    thread = {"configurable": {"thread_id": "crashed-handler"}}
    crashed = attempt(lambda: graph.invoke({"route": "", "log": []}, thread))
    crash[0] = False
    resumed = graph.invoke(None, thread)
    return {"crashed": crashed, "resumed": resumed, "runs": sorted(runs)}


def test_resumed_after_a_crashed_handler(conform: Conform) -> None:
    conform(resumed_after_a_crashed_handler)


def breakpoint_named_after_a_handler(impl: Impl) -> Any:
    """``interrupt_before`` may name a node's handler (``__error_handler__<node>``), as in
    LangGraph; the handler runs in the step its node failed in, so it is not stopped."""

    def handler(state: State, error: NodeError) -> dict[str, Any]:
        return {"log": [f"handled {error.node}"]}

    b = impl.StateGraph(State)
    b.add_node("fail_a", _fail_a, error_handler=handler)
    b.add_edge(impl.START, "fail_a")
    graph = impl.compile(b, checkpointer=impl.saver(), interrupt_before=["__error_handler__fail_a"])
    thread = {"configurable": {"thread_id": "before-handler"}}
    return {
        "first": graph.invoke({"route": "", "log": []}, thread),
        "next": graph.get_state(thread).next,
    }


def test_breakpoint_named_after_a_handler(conform: Conform) -> None:
    conform(breakpoint_named_after_a_handler)


def handler_of_a_subgraph_node(impl: Impl) -> Any:
    """A subgraph node that fails inside has its handler run in its place."""

    def handler(state: State, error: NodeError) -> dict[str, Any]:
        return {"log": [f"{error.node} failed: {error.error}"]}

    inner = impl.StateGraph(State)
    inner.add_node("fail_b", _fail_b)
    inner.add_edge(impl.START, "fail_b")
    b = impl.StateGraph(State)
    b.add_node("sub", impl.compile(inner), error_handler=handler)
    b.add_node("after", lambda s: {"log": ["after"]})
    b.add_edge(impl.START, "sub")
    b.add_edge("sub", "after")
    graph = impl.compile(b)
    return collect(graph.stream({"route": "", "log": []}, stream_mode="updates"))


def test_handler_of_a_subgraph_node(conform: Conform) -> None:
    conform(handler_of_a_subgraph_node)
