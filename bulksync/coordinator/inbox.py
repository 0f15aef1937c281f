"""Where a step's task results arrive, and how a loop waits for them.

The superstep loop is written once, as a generator (``SuperstepLoop.steps``): where it would
block on its tasks' results it yields an :class:`Await` instead, and is sent back the
results that have arrived (an empty list when the step's deadline passed first). Two
drivers move it on:

- :func:`drive` blocks its thread on the inbox: ``invoke`` on its caller's thread,
  ``stream`` on a thread of its own, and child loops, which own a thread anyway;
- the coordinator service's :class:`~bulksync.coordinator.reactor.Reactor` holds no thread
  while a run waits: the inbox's ``wake`` hook tells it when a result came, and one of its
  few threads sends it on.

The executor delivers results from any thread (``Inbox.put``).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar, cast

from bulksync.coordinator import clock
from bulksync.coordinator.executor import TaskResult

T = TypeVar("T")

log = logging.getLogger(__name__)


class Inbox:
    """The results of one step's tasks, put from any thread, taken by the loop's driver."""

    __slots__ = ("_queue", "wake")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[TaskResult] = queue.SimpleQueue()
        # Set by a driver that waits without a thread; called after each put.
        self.wake: Callable[[], None] | None = None

    def put(self, result: TaskResult) -> None:
        """Deliver one task's result (the executor's ``deliver``)."""
        self._queue.put(result)
        wake = self.wake
        if wake is not None:
            wake()

    def ready(self, limit: int) -> list[TaskResult]:
        """Up to ``limit`` results already there, without waiting."""
        taken: list[TaskResult] = []
        while len(taken) < limit:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def take(self, limit: int, deadline: float | None) -> list[TaskResult]:
        """Wait for a result until ``deadline`` (monotonic; None: for ever), then take every
        one there is, up to ``limit``; an empty list when the deadline passed first."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            first = self._queue.get(timeout=timeout)
        except queue.Empty:
            return []
        return [first, *self.ready(limit - 1)]


@dataclasses.dataclass(frozen=True, slots=True)
class Await:
    """What a loop waits for: up to ``limit`` results from ``inbox`` before ``deadline``."""

    inbox: Inbox
    limit: int
    deadline: float | None

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return clock.passed(self.deadline)


Steps = Generator[Await, list[TaskResult], T]
"""A loop in flight: yields what it waits for, is sent what arrived, returns its end."""


def drive(steps: Steps[T]) -> T:
    """Run ``steps`` to its end on this thread, blocking while it waits. Interrupted while
    it waits (Ctrl-C on the thread that runs ``invoke``), it closes ``steps`` before the
    interruption goes on, so the loop stores what it holds then, not whenever the
    generator is collected."""
    try:
        wait = next(steps)
        while True:
            try:
                arrived = wait.inbox.take(wait.limit, wait.deadline)
            except BaseException:
                _close(steps)
                raise
            wait = steps.send(arrived)
    except StopIteration as stop:
        return cast(T, stop.value)


def _close(steps: Steps[Any]) -> None:
    """Close ``steps`` on the way out of an interruption, which is what the caller sees:
    a failure to store what the loop held is logged."""
    try:
        steps.close()
    except Exception:
        log.exception("a run interrupted while it waited could not store what it held")
