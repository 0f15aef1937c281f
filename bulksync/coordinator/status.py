"""What the recorded pending writes say about each task of a step. Pure.

The single rule: a task is finished if and only if it recorded at least one write that is
not about what happened to it (``__error__``, ``__interrupt__``, ``__resume__``, and
``__node_error__``: its node failed for good, its handler is still to run). A task
that succeeded without output records ``__no_writes__``, which counts as output. So after a
crash or a failed step, re-planning the same checkpoint gives the same task ids, finished
tasks get their writes back, and only unfinished ones run again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from bulksync.checkpoint.base import PendingWrite
from bulksync.constants import (
    ERROR,
    ERROR_SOURCE_NODE,
    INTERRUPT,
    NODE_ERROR,
    NULL_TASK_ID,
    RESUME,
)
from bulksync.coordinator.spec import Write
from bulksync.types import Interrupt

STATUS_WRITES = frozenset({ERROR, ERROR_SOURCE_NODE, INTERRUPT, RESUME, NODE_ERROR})


@dataclasses.dataclass(frozen=True, slots=True)
class TaskStatus:
    """A task's recorded output, interrupts, error and interrupt answers."""

    output: tuple[Write, ...] = ()
    interrupts: tuple[Interrupt, ...] = ()
    error: Any = None
    resume: tuple[Any, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether the task produced its output (and must not run again)."""
        return bool(self.output)

    @property
    def pending_interrupts(self) -> tuple[Interrupt, ...]:
        """Interrupts still waiting for an answer."""
        return () if self.finished else self.interrupts


def read_task_statuses(writes: Iterable[PendingWrite]) -> dict[str, TaskStatus]:
    """The status of every task with recorded writes (``NULL_TASK_ID`` input excluded)."""
    output: dict[str, list[Write]] = {}
    interrupts: dict[str, list[Interrupt]] = {}
    errors: dict[str, Any] = {}
    resume: dict[str, tuple[Any, ...]] = {}
    for tid, chan, value in writes:
        if tid == NULL_TASK_ID:
            continue
        output.setdefault(tid, [])
        if chan == INTERRUPT:
            interrupts.setdefault(tid, []).extend(
                value if isinstance(value, (list, tuple)) else [value]
            )
        elif chan == ERROR:
            errors.setdefault(tid, value)
        elif chan == RESUME:
            resume[tid] = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        elif chan not in STATUS_WRITES:
            output[tid].append((chan, value))
    return {
        tid: TaskStatus(
            output=tuple(out),
            interrupts=tuple(interrupts.get(tid, ())),
            error=errors.get(tid),
            resume=resume.get(tid, ()),
        )
        for tid, out in output.items()
    }


def pending_interrupt_ids(writes: Iterable[PendingWrite]) -> set[str]:
    """Ids of interrupts raised and not yet answered by a finished task."""
    return {i.id for s in read_task_statuses(writes).values() for i in s.pending_interrupts}
