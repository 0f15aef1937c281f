"""``LazyCalls``: a task's ``Calls`` are built at its first ``@task`` call, once."""

from __future__ import annotations

import threading
import time
from typing import Any

from bulksync.workers.calls import LazyCalls

THREADS = 8


def test_a_task_that_starts_no_call_has_none_to_wait_for() -> None:
    built: list[int] = []
    lazy = LazyCalls(lambda: built.append(1))  # type: ignore[arg-type, func-returns-value]
    assert lazy.ended() and lazy.join() == ()
    assert built == []


def test_threads_starting_their_first_calls_at_once_share_one_calls() -> None:
    built: list[object] = []

    def build() -> Any:
        time.sleep(0.05)  # the window in which another thread asks as well
        built.append(object())
        return built[-1]

    lazy = LazyCalls(build)
    start = threading.Barrier(THREADS)
    got: list[object] = []

    def first_call() -> None:
        start.wait()
        got.append(lazy())

    threads = [threading.Thread(target=first_call) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    assert got == built * THREADS
