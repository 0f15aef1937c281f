"""A loop's checkpoint commit is sent, and confirmed while the next step gets ready
(``checkpoint/pg_flight.py``): what a reader of the run sees meanwhile is what it saw before.
In process, on a real Postgres (skips without it, fails under ``CI``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest

from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.constants import END, START
from bulksync.graph import StateGraph
from tests.unit.checkpoint.conftest import _postgres_saver

WAIT = 30.0


@pytest.fixture
def postgres() -> Iterator[PostgresSaver]:
    yield from _postgres_saver()


class Count(TypedDict):
    i: int


def counter(saver: PostgresSaver, steps: int) -> Any:
    """START -> tick, looping until ``i == steps``."""
    b = StateGraph(Count)
    b.add_node("tick", lambda s: {"i": s["i"] + 1})
    b.add_edge(START, "tick")
    b.add_conditional_edges("tick", lambda s: "tick" if s["i"] < steps else END, ["tick", END])
    return b.compile(checkpointer=saver)


def test_a_stream_reader_may_commit_with_the_same_saver_between_chunks(
    postgres: PostgresSaver,
) -> None:
    # Each step's commit is confirmed before its chunks reach the caller's code: code that
    # reaches the saver there (another run, here) neither waits on it forever nor reads an
    # older checkpoint than the chunk.
    graph = counter(postgres, 4)
    config = {"configurable": {"thread_id": "read"}}
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for n, chunk in enumerate(graph.stream({"i": 0}, config, durability="sync")):
                other = {"configurable": {"thread_id": f"other-{n}"}}
                assert graph.invoke({"i": 3}, other, durability="sync") == {"i": 4}
                head = postgres.get_tuple(config)
                assert head is not None
                seen.append((chunk["tick"]["i"], head.checkpoint.channel_values["i"]))
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(WAIT)
    assert not reader.is_alive(), "the reader's own commit waited on the run's"
    assert errors == []
    assert seen == [(k, k) for k in range(1, 5)]


def test_invoke_returns_with_its_last_checkpoint_stored(postgres: PostgresSaver) -> None:
    graph = counter(postgres, 5)
    config = {"configurable": {"thread_id": "t"}}
    assert graph.invoke({"i": 0}, config, durability="sync") == {"i": 5}
    head = postgres.get_tuple(config)
    assert head is not None and head.checkpoint.channel_values["i"] == 5
    assert [c.metadata["step"] for c in postgres.list(config)] == list(range(5, -2, -1))
