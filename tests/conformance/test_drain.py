"""``RunControl``: a drain stops a run cleanly between two steps; the thread goes on later.

The control lives in the caller's process: the scenarios ask for the drain from a node that
closes over it (on the attached cluster the loop, which checks it, runs here). A RemoteGraph
run is stopped through its run instead (``Client.cancel``), so the ``remote`` flavour skips
these (``impls.EXCLUDED``).
"""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

from .harness import Conform, attempt
from .impls import Impl

pytestmark = pytest.mark.conformance


class Steps(TypedDict, total=False):
    first: str
    second: str


def _two_steps(impl: Impl, control: Any, reason: str) -> Any:
    def first(state: Steps) -> dict[str, str]:
        control.request_drain(reason)
        return {"first": "done"}

    b = impl.StateGraph(Steps)
    b.add_node("first", first)
    b.add_node("second", lambda s: {"second": "done"})
    b.add_edge(impl.START, "first")
    b.add_edge("first", "second")
    return b


def drain_and_resume(impl: Impl) -> Any:
    """The run stops after the step that asked; resuming runs the rest, once."""
    control = impl.runtime.RunControl()
    graph = impl.compile(_two_steps(impl, control, "sigterm"), checkpointer=impl.saver())
    thread = {"configurable": {"thread_id": "drain"}}
    stopped = attempt(lambda: graph.invoke({}, thread, control=control))
    return {
        "stopped": (type(stopped).__name__, getattr(stopped, "reason", None)),
        "next": graph.get_state(thread).next,
        "resumed": graph.invoke(None, thread),
        "history": [s.next for s in graph.get_state_history(thread)],
    }


def test_drain_and_resume(conform: Conform) -> None:
    conform(drain_and_resume)


def drain_in_the_last_step_or_before_a_breakpoint(impl: Impl) -> Any:
    """A drain asked in the last step changes nothing; before a breakpoint, the breakpoint
    wins (a resume would pass it)."""

    def last(state: Steps) -> dict[str, str]:
        done.request_drain()
        return {"first": "done"}

    done = impl.runtime.RunControl()
    b = impl.StateGraph(Steps)
    b.add_node("last", last)
    b.add_edge(impl.START, "last")
    breakpoint_control = impl.runtime.RunControl()
    paused = impl.compile(
        _two_steps(impl, breakpoint_control, "rollout"),
        checkpointer=impl.saver(),
        interrupt_before=["second"],
    )
    thread = {"configurable": {"thread_id": "breakpoint"}}
    return {
        "last": impl.compile(b).invoke({}, control=done),
        "drained": done.drain_requested,
        "paused": paused.invoke({}, thread, control=breakpoint_control),
        "next": paused.get_state(thread).next,
    }


def test_drain_in_the_last_step_or_before_a_breakpoint(conform: Conform) -> None:
    conform(drain_in_the_last_step_or_before_a_breakpoint)
