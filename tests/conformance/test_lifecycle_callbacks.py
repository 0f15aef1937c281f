"""Graph lifecycle callbacks: a ``GraphCallbackHandler`` in a run's callbacks hears the run
pause on interrupts and resume; other handlers do not; a failing handler is logged unless
it asks (``raise_error``) for its error to end the run."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    answer: str | None


def _graph(impl: Impl) -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"answer": impl.interrupt("Provide value")}

    b = impl.StateGraph(State)
    b.add_node("ask", ask)
    b.add_node("after", lambda state: {"answer": f"{state['answer']}!"})
    b.add_edge(impl.START, "ask")
    b.add_edge("ask", "after")
    return impl.compile(b, checkpointer=impl.saver(), interrupt_before=["after"])


def _recorder(impl: Impl, *, fail: str | None = None, raise_error: bool = False) -> Any:
    class Recorder(impl.callbacks.GraphCallbackHandler):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            self.raise_error = raise_error
            self.events: list[Any] = []

        def on_interrupt(self, event: Any) -> None:
            values = [i.value for i in event.interrupts]
            self.events.append(("interrupt", event.status, event.checkpoint_ns, values))
            if fail == "interrupt":
                raise ValueError("handler broke on interrupt")

        def on_resume(self, event: Any) -> None:
            self.events.append(("resume", event.status, event.checkpoint_ns))
            if fail == "resume":
                raise ValueError("handler broke on resume")

    return Recorder()


def lifecycle_events(impl: Impl) -> Any:
    graph = _graph(impl)
    seen, failing = _recorder(impl), _recorder(impl, fail="resume")
    config = {"configurable": {"thread_id": "lifecycle"}, "callbacks": [failing, seen]}
    first = graph.invoke({"answer": None}, config)
    second = graph.invoke(impl.Command(resume="done"), config)
    third = graph.invoke(None, config)
    return {
        "outputs": [first, second, third],
        "events": seen.events,
        "failing_handler_saw": failing.events,
    }


def test_lifecycle_events(conform: Conform) -> None:
    conform(lifecycle_events)


def raising_handler(impl: Impl) -> Any:
    graph = _graph(impl)
    strict = _recorder(impl, fail="interrupt", raise_error=True)
    config = {"configurable": {"thread_id": "lifecycle-raise"}, "callbacks": [strict]}
    try:
        graph.invoke({"answer": None}, config)
        raised: Any = None
    except ValueError as exc:
        raised = str(exc)

    async def run_async() -> Any:
        seen = _recorder(impl)
        config = {"configurable": {"thread_id": "lifecycle-async"}, "callbacks": [seen]}
        await graph.ainvoke({"answer": None}, config)
        await graph.ainvoke(impl.Command(resume="later"), config)
        return seen.events

    return {"raised": raised, "async": asyncio.run(run_async())}


def test_raising_handler(conform: Conform) -> None:
    conform(raising_handler)


def streamed_lifecycle(impl: Impl) -> Any:
    graph = _graph(impl)
    seen = _recorder(impl)
    config = {"configurable": {"thread_id": "lifecycle-stream"}, "callbacks": [seen]}
    chunks = [list(graph.stream({"answer": None}, config, stream_mode="updates"))]
    chunks.append(list(graph.stream(impl.Command(resume="yes"), config, stream_mode="updates")))
    strict = _recorder(impl, fail="resume", raise_error=True)
    try:
        list(graph.stream(None, {**config, "callbacks": [strict]}, stream_mode="updates"))
        raised: Any = None
    except ValueError as exc:
        raised = str(exc)
    return {"chunks": chunks, "events": seen.events, "raised": raised}


def test_streamed_lifecycle(conform: Conform) -> None:
    conform(streamed_lifecycle)
