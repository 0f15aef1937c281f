"""A step handed many reports at once handles them with the garbage collector paused."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from bulksync.collector import WIDE
from bulksync.workers.celery.step import CeleryStep


@pytest.fixture
def handled(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CeleryStep, list[bool]]]:
    """A bare step whose entries' handling records whether the collector was on."""
    seen: list[bool] = []
    step = CeleryStep.__new__(CeleryStep)  # (no executor: only receive() runs)
    monkeypatch.setattr(step, "_handle", lambda entry: seen.append(gc.isenabled()))
    was = gc.isenabled()
    gc.enable()
    yield step, seen
    if not was:
        gc.disable()


def test_a_drain_of_many_reports_is_handled_with_the_collector_paused(
    handled: tuple[CeleryStep, list[bool]],
) -> None:
    step, seen = handled
    step.receive([b"r"] * WIDE)
    assert seen == [False] * WIDE
    assert gc.isenabled()


def test_a_few_reports_leave_it_on(handled: tuple[CeleryStep, list[bool]]) -> None:
    step, seen = handled
    step.receive([b"r"] * 3)
    assert seen == [True] * 3
