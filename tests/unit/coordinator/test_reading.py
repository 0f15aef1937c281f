"""A loop driven by the thread that reads its stream (``inbox.Reading``): its chunks come as
they are put, from any thread; a reader that leaves hands the loop to a thread of its own."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bulksync.coordinator.executor import TaskResult
from bulksync.coordinator.inbox import STREAMED, Await, Chunks, Inbox, Reading, Steps


def _loop(chunks: Chunks, inbox: Inbox, log: list[str]) -> Steps[str]:
    """Streams a chunk, yields STREAMED, waits for one result, streams another, ends."""
    chunks.put("step 1 planned")
    yield STREAMED
    log.append("tasks started")
    ready = yield Await(inbox, 1, None)
    chunks.put(f"got {ready[0].task_id}")
    return "end"


def _read(reading: Reading[str], seen: list[Any]) -> str:
    items = reading.items()
    while True:
        try:
            seen.append(next(items))
        except StopIteration as stop:
            return str(stop.value)


def test_chunks_come_as_they_are_put_and_the_steps_chunks_before_its_tasks() -> None:
    chunks, inbox, log = Chunks(), Inbox(), []
    seen: list[Any] = []
    reading = Reading(_loop(chunks, inbox, log), chunks, lambda end: chunks.put(f"ended {end}"))

    def node() -> None:  # on another thread, while the loop waits
        while "tasks started" not in log:
            threading.Event().wait(0.001)
        chunks.put("a token")
        inbox.put(TaskResult("t1", ()))

    threading.Thread(target=node, daemon=True).start()
    assert _read(reading, seen) == "end"
    assert seen == ["step 1 planned", "a token", "got t1", "ended end"]


def test_a_reader_that_leaves_hands_the_loop_on_and_yields_nothing_more() -> None:
    """Closed after the hand-over with items still pending, it yields none of them (a
    generator that yields while closing is a RuntimeError)."""
    chunks, inbox, log = Chunks(), Inbox(), []
    reading = Reading(_loop(chunks, inbox, log), chunks, lambda end: None)
    items = reading.items()
    assert next(items) == "step 1 planned"  # the loop waits at STREAMED
    chunks.put("unread")
    reading.finish_elsewhere("test-reading-rest")
    items.close()
    done = threading.Event()
    threading.Thread(target=lambda: (inbox.put(TaskResult("t1", ())), done.set())).start()
    assert done.wait(5)
    for thread in threading.enumerate():
        if thread.name == "test-reading-rest":
            thread.join(5)
    assert log == ["tasks started"]  # driven on past STREAMED, to its end
    assert "got t1" in chunks.take()


def test_what_the_loop_raises_comes_after_the_chunks_put_before_it() -> None:
    chunks = Chunks()

    def failing() -> Steps[str]:
        chunks.put("before")
        yield STREAMED
        raise ValueError("the loop failed")

    seen: list[Any] = []
    with pytest.raises(ValueError, match="the loop failed"):
        _read(Reading(failing(), chunks, lambda end: None), seen)
    assert seen == ["before"]
