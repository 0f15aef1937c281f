"""A result whose report was lost (taken from the inbox, its reply never read) is delivered
from its slot, and a report still in the shared inbox never is overtaken by its slot."""

from __future__ import annotations

import types
from typing import Any

from bulksync.coordinator.executor import TaskResult
from bulksync.workers import wire
from bulksync.workers.celery.gatherer import Backlog
from bulksync.workers.celery.step import CeleryStep


class _Pipe:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **_: None


def _step(*task_ids: str) -> tuple[CeleryStep, list[str]]:
    """A step owing ``task_ids`` (their slots are their ids); the ids it delivers."""
    delivered: list[str] = []
    executor = types.SimpleNamespace(gatherer=types.SimpleNamespace(new_key=lambda: "g.s"))
    tasks = [types.SimpleNamespace(id=t, name="node") for t in task_ids]
    step = CeleryStep(
        executor,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        types.SimpleNamespace(config={}),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        tasks,  # type: ignore[arg-type]
        lambda result: delivered.append(result.task_id),
        "run",
    )
    step.slots = {t: t for t in task_ids}
    return step, delivered


def _look(step: CeleryStep, recorded: dict[str, bytes], backlog: Backlog) -> None:
    """One probe of ``step``: its hash exists, ``recorded`` are the results in their slots."""
    step.probe(_Pipe())
    found = [recorded.get(t) for t in step._probed]
    step.settle([1, found], backlog)


def _result(task_id: str) -> bytes:
    return wire.dumps_result(TaskResult(task_id, (("out", 1),)), "node")


def test_a_result_is_delivered_at_once_when_the_inbox_was_empty() -> None:
    step, delivered = _step("a", "b")
    _look(step, {"a": _result("a")}, Backlog(taken=7, through=7))
    assert delivered == ["a"]


def test_a_result_waits_until_the_inbox_held_at_its_first_look_was_taken() -> None:
    step, delivered = _step("a", "b")
    seen = {"a": _result("a")}
    _look(step, seen, Backlog(taken=0, through=5))  # its report may be among those 5
    assert delivered == []
    _look(step, seen, Backlog(taken=3, through=9))  # two of them not taken yet
    assert delivered == []
    _look(step, seen, Backlog(taken=9, through=12))  # all 9 taken, and never reported
    assert delivered == ["a"]


def test_a_result_first_seen_behind_a_busy_inbox_is_not_taken_from_its_slot() -> None:
    step, delivered = _step("a", "b")
    _look(step, {"a": _result("a")}, Backlog(taken=0, through=5))
    # "b" is recorded after the first look: its report is behind the entries counted then.
    both = {"a": _result("a"), "b": _result("b")}
    _look(step, both, Backlog(taken=6, through=8))
    assert delivered == ["a"]
    _look(step, {"b": _result("b")}, Backlog(taken=8, through=9))
    assert delivered == ["a", "b"]
