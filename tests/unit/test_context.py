"""The task context: a run-wide resume answer is consumed by exactly one interrupt."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from bulksync.context import NullResume


def test_null_resume_is_taken_once_then_falls_back_to_the_parent() -> None:
    parent = NullResume("outer")
    child = NullResume("inner", parent)
    assert child.peek() == "inner"
    assert child.take() == "inner"
    assert child.peek() == "outer"
    assert child.take() == "outer"
    assert child.take() is None
    assert child.peek() is None


def test_null_resume_taken_by_racing_threads_goes_to_exactly_one() -> None:
    for _ in range(50):
        answer = NullResume("yes")
        start = threading.Barrier(8)

        def take(_: int, answer: NullResume = answer, start: threading.Barrier = start) -> object:
            start.wait()
            return answer.take()

        with ThreadPoolExecutor(8) as pool:
            taken = list(pool.map(take, range(8)))
        assert taken.count("yes") == 1
        assert taken.count(None) == 7
