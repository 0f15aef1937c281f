"""A stream the caller breaks off stops its run: no step starts after it, sync or async.

As on LangGraph, a step's chunks reach the reader before the next step's tasks start; a
step that is running when the reader leaves (here: its node streamed a custom chunk)
finishes on a thread of its own."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from typing import Annotated, Any, TypedDict

from bulksync.config import get_stream_writer
from bulksync.graph import START, StateGraph


class S(TypedDict):
    log: Annotated[list[str], operator.add]


class Chain:
    """a → b → c, where b streams a custom chunk, then waits until the caller has broken
    off."""

    def __init__(self) -> None:
        self.broken = threading.Event()
        self.b_done = threading.Event()
        self.ran: list[str] = []

    def graph(self) -> Any:
        def b(state: S) -> dict[str, Any]:
            self.ran.append("b")
            get_stream_writer()("b runs")
            get_stream_writer()("b still runs")  # left unread when the caller breaks off
            assert self.broken.wait(5), "the caller never broke off"
            self.b_done.set()
            return {"log": ["b"]}

        def c(state: S) -> dict[str, Any]:
            self.ran.append("c")
            return {"log": ["c"]}

        return (
            StateGraph(S)
            .add_node("a", lambda s: {"log": ["a"]})
            .add_node("b", b)
            .add_node("c", c)
            .add_edge(START, "a")
            .add_edge("a", "b")
            .add_edge("b", "c")
            .compile(name="abandoned-stream")
        )

    def settle(self) -> None:
        """Wait for the run's thread, if the reader left one to finish its step, to end."""
        deadline = time.monotonic() + 5
        while any(t.name == "bulksync-run-abandoned-stream" for t in threading.enumerate()):
            assert time.monotonic() < deadline, "the run went on after the caller left"
            time.sleep(0.01)


def test_breaking_off_between_steps_starts_no_other_step() -> None:
    chain = Chain()
    for chunk in chain.graph().stream({"log": []}, stream_mode="updates"):
        assert chunk == {"a": {"log": ["a"]}}
        break
    chain.broken.set()
    chain.settle()
    assert chain.ran == []  # a's update came before b started; b never did


def test_breaking_off_a_stream_stops_the_run() -> None:
    chain = Chain()
    for chunk in chain.graph().stream({"log": []}, stream_mode="custom"):
        assert chunk == "b runs"
        break
    chain.broken.set()
    assert chain.b_done.wait(5)
    chain.settle()
    assert chain.ran == ["b"]  # b had started and finished; c never started


def test_breaking_off_an_async_stream_stops_the_run() -> None:
    chain = Chain()

    async def read() -> None:
        chunks = chain.graph().astream({"log": []}, stream_mode="custom")
        async for chunk in chunks:
            assert chunk == "b runs"
            break
        await chunks.aclose()

    asyncio.run(read())
    chain.broken.set()
    assert chain.b_done.wait(5)
    chain.settle()
    assert chain.ran == ["b"]
