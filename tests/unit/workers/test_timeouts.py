"""Timed attempts (``workers/timeouts.py``) and the policy's parts: coercion, the error, the
wire, and the progress signals that keep an idle timeout from firing."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any, TypedDict

import pytest

from bulksync.checkpoint.serde import MsgpackSerde
from bulksync.config import get_stream_writer
from bulksync.coordinator.plan import Task
from bulksync.errors import InvalidGraphError, NodeTimeoutError
from bulksync.graph import END, START, StateGraph
from bulksync.types import Send, TimeoutPolicy
from bulksync.workers import wire
from bulksync.workers.timeouts import AttemptClock, run_timed


class State(TypedDict):
    x: int


def graph_of(node: Any, **node_kw: Any) -> Any:
    b = StateGraph(State)
    b.add_node("work", node, **node_kw)
    b.add_edge(START, "work")
    b.add_edge("work", END)
    return b.compile()


# -- the policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, None),
        (2, TimeoutPolicy(run_timeout=2.0)),
        (timedelta(milliseconds=250), TimeoutPolicy(run_timeout=0.25)),
        (TimeoutPolicy(idle_timeout=timedelta(seconds=1)), TimeoutPolicy(idle_timeout=1.0)),
        (TimeoutPolicy(), None),  # no limit at all: no timeout
    ],
)
def test_coerce_reads_numbers_and_timedeltas_as_seconds(given: Any, expected: Any) -> None:
    assert TimeoutPolicy.coerce(given) == expected


def test_coerce_keeps_a_policy_already_in_seconds() -> None:
    policy = TimeoutPolicy(run_timeout=1.0, idle_timeout=0.5, refresh_on="heartbeat")
    assert TimeoutPolicy.coerce(policy) is policy


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (0, "run_timeout must be greater than 0"),
        (-1.5, "run_timeout must be greater than 0"),
        (TimeoutPolicy(idle_timeout=timedelta(0)), "idle_timeout must be greater than 0"),
        ("5", "run_timeout must be a number of seconds or a timedelta"),
        (True, "run_timeout must be a number of seconds or a timedelta"),
        (TimeoutPolicy(idle_timeout=1, refresh_on="sometimes"), "use 'auto' or 'heartbeat'"),  # type: ignore[arg-type]
    ],
)
def test_coerce_refuses_what_is_no_timeout(given: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimeoutPolicy.coerce(given)


def test_add_node_names_the_node_with_a_bad_timeout() -> None:
    with pytest.raises(InvalidGraphError, match=r"add_node\('work'\): run_timeout must be"):
        StateGraph(State).add_node("work", lambda s: s, timeout=0)


def test_a_subgraph_node_with_a_timeout_is_refused_naming_it() -> None:
    async def inner_node(state: State) -> State:
        return state

    inner = StateGraph(State)
    inner.add_node("inner_node", inner_node)
    inner.add_edge(START, "inner_node")
    b = StateGraph(State)
    b.add_node("sub", inner.compile(), timeout=1)
    b.add_edge(START, "sub")
    with pytest.raises(InvalidGraphError, match="Node 'sub' is a subgraph with a timeout"):
        b.compile()


def test_a_runnable_with_an_async_side_is_timed_through_it() -> None:
    from langchain_core.runnables import RunnableLambda

    async def slow(state: State) -> State:
        await asyncio.sleep(2)
        return state

    both = RunnableLambda(lambda s: s, afunc=slow)
    with pytest.raises(NodeTimeoutError):
        graph_of(both, timeout=0.1).invoke({"x": 1})
    with pytest.raises(InvalidGraphError, match="only supported for async nodes"):
        graph_of(RunnableLambda(lambda s: s), timeout=0.1)


# -- the error and the wire ------------------------------------------------------------


def test_the_error_says_which_limit_fired_and_keeps_both() -> None:
    error = NodeTimeoutError("work", 0.61, "idle", idle_timeout=0.5, run_timeout=3.0)
    assert (error.kind, error.timeout, error.run_timeout) == ("idle", 0.5, 3.0)
    assert "idle timeout of 0.500s" in str(error) and "heartbeat" in str(error)
    assert not isinstance(error, TimeoutError)  # the default retry policy retries it
    with pytest.raises(ValueError, match="needs that kind's timeout"):
        NodeTimeoutError("work", 1.0, "run", idle_timeout=0.5)


def test_the_error_crosses_the_wire_whole() -> None:
    error = NodeTimeoutError("work", 0.61, "run", run_timeout=0.5)
    back = wire.loads_error(wire.dumps_error(error))
    assert isinstance(back, NodeTimeoutError)
    assert (back.node, back.kind, back.timeout, back.elapsed) == ("work", "run", 0.5, 0.61)


def test_a_sends_timeout_survives_the_serde_and_its_task_descriptor() -> None:
    policy = TimeoutPolicy(run_timeout=2.0, idle_timeout=0.5, refresh_on="heartbeat")
    serde = MsgpackSerde()
    send = Send("work", {"x": 1}, timeout=policy)
    assert serde.loads(serde.dumps(send)) == send
    assert serde.loads(serde.dumps(Send("work", 1))).timeout is None
    task = Task(
        "id", "work", ("__pregel_push", 0, False), None, ("__pregel_push",), 1, "ns", policy
    )
    desc = wire.TaskDescriptor.unpack(wire.TaskDescriptor.of(task, "slot").pack())
    assert desc.task(None) == task
    untimed = wire.TaskDescriptor.of(Task("id", "work", (), None, (), 1, "ns"), "slot").pack()
    assert len(untimed) == 7  # a task without a timeout packs as before


# -- the watchdog ----------------------------------------------------------------------


def test_a_coroutine_that_swallows_its_cancellation_still_times_out() -> None:
    ended: list[str] = []

    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            ended.append("cancelled")
            return "ignored"
        return "finished"

    clock = AttemptClock(TimeoutPolicy(run_timeout=0.05))

    async def main() -> None:
        with pytest.raises(NodeTimeoutError):
            await run_timed(stubborn(), clock, "stubborn")
        await asyncio.sleep(0)  # let the cancelled coroutine run its handler

    asyncio.run(main())
    assert ended == ["cancelled"]
    assert clock.active is False


def test_stream_writes_after_the_timeout_are_dropped() -> None:
    seen: list[Any] = []
    clock = AttemptClock(TimeoutPolicy(idle_timeout=1.0))
    write = clock.guard(seen.append)
    write("before")
    clock.expired("work", "idle")
    write("after")
    assert seen == ["before"]


def test_custom_stream_writes_count_as_progress() -> None:
    async def chatty(state: State) -> State:
        writer = get_stream_writer()
        for i in range(5):
            await asyncio.sleep(0.08)
            writer(i)
        return {"x": 5}

    graph = graph_of(chatty, timeout=TimeoutPolicy(idle_timeout=0.25))
    assert list(graph.stream({"x": 0}, stream_mode="custom")) == [0, 1, 2, 3, 4]


def test_model_tokens_count_as_progress() -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    class SlowTokens(GenericFakeChatModel):
        async def _astream(self, *args: Any, **kwargs: Any) -> Any:
            async for chunk in super()._astream(*args, **kwargs):
                await asyncio.sleep(0.08)
                yield chunk

    model = SlowTokens(messages=iter([AIMessage(content="one two three four five")]))

    async def call(state: State) -> State:
        async for _ in model.astream("hi"):  # no config handed on: found from the context
            pass
        return {"x": 1}

    graph = graph_of(call, timeout=TimeoutPolicy(idle_timeout=0.25))
    started = time.monotonic()
    assert asyncio.run(graph.ainvoke({"x": 0})) == {"x": 1}
    assert time.monotonic() - started > 0.25  # it outlived the idle limit by making progress
