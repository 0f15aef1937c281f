"""``collector.paused``: wide bulk work runs with the cyclic garbage collector off."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from bulksync import collector
from bulksync.collector import WIDE


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    """Each test starts with the collector on, and leaves it as it found it."""
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()  # (a test may have turned it off)
    else:
        gc.disable()


def test_small_work_leaves_the_collector_on() -> None:
    with collector.paused(WIDE - 1):
        assert gc.isenabled()
    assert gc.isenabled()


def test_wide_work_pauses_it_then_turns_it_back_on() -> None:
    with collector.paused(WIDE):
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_turns_it_back_on() -> None:
    with pytest.raises(ValueError, match="inside"), collector.paused(WIDE):
        raise ValueError("inside")
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off() -> None:
    gc.disable()
    with collector.paused(WIDE):
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_pauses_of_two_threads_end_with_the_last() -> None:
    inside, first_left, seen = threading.Event(), threading.Event(), []

    def other() -> None:
        with collector.paused(WIDE):
            inside.set()
            first_left.wait(5)
            seen.append(gc.isenabled())  # the main thread left: still paused for this one

    with collector.paused(WIDE):
        thread = threading.Thread(target=other)
        thread.start()
        assert inside.wait(5)
    first_left.set()
    thread.join(5)
    assert seen == [False]
    assert gc.isenabled()


def test_no_collection_runs_inside_a_pause() -> None:
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with collector.paused(WIDE):
            kept = [[i] for i in range(20 * gc.get_threshold()[0])]
            during = len(collections)
        more = [[i] for i in range(20 * gc.get_threshold()[0])]
    finally:
        gc.callbacks.remove(count)
    assert during == 0
    assert collections, "the same allocations set off collections once the pause ended"
    assert len(kept) == len(more)
