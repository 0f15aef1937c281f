"""The seam between the superstep loop and whatever runs node tasks.

The loop hands an ``Executor`` one step's tasks plus a ``StepInput`` (the step's stored
channel values — everything a task reads — and the run's resume answers), and blocks until
each task's ``TaskResult`` is delivered. It assumes nothing about where tasks run: the
in-process executor uses threads, a cluster executor ships the same records to workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from bulksync.context import NullResume
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.types import Interrupt

StreamSink = Callable[[tuple[str, ...], str, Any], None]
"""Receives ``(namespace, mode, chunk)`` stream events of a run and its subgraphs."""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskResult:
    """What one task produced: its writes, or the error or interrupts that stopped it.

    ``writes`` include control writes (``__resume__`` answers consumed so far) even when the
    task was interrupted; an errored task's ``writes`` are discarded by the loop.
    """

    task_id: str
    writes: tuple[Write, ...] = ()
    error: BaseException | None = None
    interrupts: tuple[Interrupt, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class StepInput:
    """What every task of a step shares besides the graph.

    ``channel_values`` is the step's state as stored (a claim check: one copy per step, not
    per task). ``resume`` maps a task id to the interrupt answers it already consumed.
    ``nested`` carries what a subgraph invoked inside a node needs to nest under its task
    (only in-process executors can pass it; cluster workers rebuild it).
    """

    channel_values: Mapping[str, Any]
    config: Mapping[str, Any]
    stop: int
    resume: Mapping[str, list[Any]]
    resume_map: Mapping[str, Any] | None
    null_resume: NullResume
    sink: StreamSink
    namespace: tuple[str, ...]
    nested: Any = None


class StepHandle(Protocol):
    """A step in flight."""

    def cancel(self) -> None:
        """Stop the step's unfinished tasks; each gets a ``TaskCancelledError`` result."""


class Executor(Protocol):
    """Runs a step's tasks and delivers exactly one result per task, in completion order.

    A task stopped by ``StepHandle.cancel`` (or by the run being cancelled) is delivered with
    ``error=TaskCancelledError``; a task that outran its node's timeout with
    ``TaskTimeoutError``.
    """

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> StepHandle:
        """Start ``tasks``; call ``deliver`` from any thread as each one finishes."""
