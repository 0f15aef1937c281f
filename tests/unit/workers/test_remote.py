"""The transport-neutral worker side: a task from its bytes to its encoded result."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

from bulksync.config import get_stream_writer
from bulksync.constants import PULL
from bulksync.coordinator.executor import Nesting, StepInput
from bulksync.coordinator.plan import Task
from bulksync.graph import END, START, StateGraph
from bulksync.workers import wire
from bulksync.workers.remote import RemoteStep, run_encoded


class State(TypedDict, total=False):
    x: int


def double(state: State) -> State:
    get_stream_writer()({"saw": state["x"]})
    return {"x": state["x"] * 2}


def fail(state: State) -> State:
    raise ValueError("no good")


def graph() -> Any:
    builder = StateGraph(State)
    builder.add_node("double", double)
    builder.add_node("fail", fail)
    builder.add_edge(START, "double")
    builder.add_edge(START, "fail")
    builder.add_edge("double", END)
    builder.add_edge("fail", END)
    return builder.compile()


def step_bytes() -> bytes:
    step = StepInput(
        channel_values={"x": 3},
        config={"configurable": {"thread_id": "t"}},
        stop=25,
        resume={},
        resume_map=None,
        null_resume=None,
        namespace=(),
        nesting=Nesting(25, "sync", ("custom",), False, {"": "cp-1"}),
    )
    return wire.dumps_state(step)


def encoded_task(node: str) -> tuple[Task, bytes, bytes]:
    task = Task("task-1", node, (PULL, node), {"x": 3}, ("branch:to:" + node,), 1, f"{node}:1")
    desc = wire.dumps_descriptor(wire.TaskDescriptor.of(task, task.id))
    return task, desc, wire.dumps_input(task.input, task)


def test_run_encoded_returns_the_encoded_result_and_streams_to_the_sink() -> None:
    events: list[tuple[Any, ...]] = []
    _, desc, data = encoded_task("double")
    out = run_encoded(graph().spec, step_bytes(), desc, data, lambda *e: events.append(e))
    result = wire.loads_result(out)
    assert result.task_id == "task-1" and result.error is None
    assert ("x", 6) in result.writes
    assert events == [((), "custom", {"saw": 3})]


def test_a_failed_task_is_reported_but_not_kept() -> None:
    _, desc, data = encoded_task("fail")
    remote = RemoteStep(graph().spec, step_bytes())
    outcome = remote.run(wire.loads_descriptor(desc), data, remote.live(lambda *e: None))
    assert outcome.keep is False
    error = wire.loads_result(outcome.data).error
    assert isinstance(error, ValueError) and "no good" in str(error)


def test_an_async_task_with_no_call_running_ends_on_its_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Joining a task's ``@task`` calls blocks: a thread does it, but only while some run."""
    hops: list[Any] = []
    real = asyncio.to_thread

    async def counted(func: Any, *args: Any) -> Any:
        hops.append(func)
        return await real(func, *args)

    async def halve(state: State) -> State:
        await asyncio.sleep(0)
        return {"x": state["x"] // 2}

    builder = StateGraph(State)
    builder.add_node("halve", halve)
    builder.add_edge(START, "halve")
    builder.add_edge("halve", END)
    _, desc, data = encoded_task("halve")
    remote = RemoteStep(builder.compile().spec, step_bytes())
    monkeypatch.setattr(asyncio, "to_thread", counted)
    live = remote.live(lambda *e: None)
    outcome = asyncio.run(remote.arun(wire.loads_descriptor(desc), data, live))
    assert ("x", 1) in wire.loads_result(outcome.data).writes
    assert hops == []
