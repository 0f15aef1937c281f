"""Where a step's task results arrive, and how a loop waits for them.

The superstep loop is written once, as a generator (``SuperstepLoop.steps``): where it would
block on its tasks' results it yields an :class:`Await` instead, and is sent back the
results that have arrived (an empty list when the step's deadline passed first). Two
drivers move it on:

- :func:`drive` blocks its thread on the inbox: child loops, which own a thread anyway;
- :class:`Reading` drives a root run on the thread that reads its stream (``stream``,
  ``invoke``), as LangGraph does: it yields what the loop streams, from the loop or from
  other threads (:class:`Chunks`), and waits for the results in between;
- the coordinator service's :class:`~bulksync.coordinator.reactor.Reactor` holds no thread
  while a run waits: the inbox's ``wake`` hook tells it when a result came, and one of its
  few threads sends it on.

The executor delivers results from any thread (``Inbox.put``).
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar, cast

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

STREAMED = Await(Inbox(), 0, None)
"""What a loop its stream's reader drives (:class:`Reading`) yields once a step's chunks are
streamed, before the step's tasks start: the reader takes them first, as on LangGraph. It is
sent nothing back; the reactor never sees it."""


def drive(steps: Steps[T], wait: Await | None = None) -> T:
    """Run ``steps`` to its end on this thread, blocking while it waits; from ``wait`` when
    it waits already (a loop another driver started). Interrupted while it waits (Ctrl-C on
    the thread of a lone node that invoked a subgraph), it closes ``steps`` before the
    interruption goes on, so the loop stores what it holds then, not whenever the generator
    is collected."""
    try:
        if wait is None:
            wait = next(steps)
        while True:
            try:
                arrived = [] if wait is STREAMED else wait.inbox.take(wait.limit, wait.deadline)
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


class Chunks:
    """What a loop streams, put from any thread (the loop's, the gatherer's, a node's),
    taken by the thread that drives the loop and reads them (:class:`Reading`)."""

    __slots__ = ("_items", "_cond")

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()

    def put(self, item: Any) -> None:
        """Add one item; wakes the reader if it waits."""
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def take(self) -> list[Any]:
        """Every item put so far, in order."""
        with self._cond:
            items = list(self._items)
            self._items.clear()
        return items

    def _poke(self) -> None:
        with self._cond:
            self._cond.notify()

    def wait(self, wait: Await) -> list[TaskResult] | None:
        """The results that arrived for ``wait`` (an empty list once its deadline passed
        first), or None when items came first."""
        inbox = wait.inbox
        inbox.wake = self._poke  # a result put meanwhile waits for the lock, then wakes this
        try:
            with self._cond:
                while True:
                    ready = inbox.ready(wait.limit)
                    if ready:
                        return ready
                    if self._items:
                        return None
                    if wait.deadline is None:
                        self._cond.wait()
                        continue
                    left = wait.deadline - time.monotonic()
                    if left <= 0:
                        return []
                    self._cond.wait(left)
        finally:
            inbox.wake = None


class Reading(Generic[T]):
    """Drives ``steps`` on the thread that reads what the loop streams into ``chunks``:
    no thread of its own, no item handed between threads. The loop runs in an empty
    context, as on a thread of its own.

    A reader that stops before the end (it broke off, or was interrupted while it waited)
    calls :meth:`finish_elsewhere`: a thread of its own drives the loop on from there, as the
    loop would have gone on; abandoned, it stops before its next step.
    """

    def __init__(self, steps: Steps[T], chunks: Chunks, ended: Callable[[T], None]) -> None:
        """``ended`` is called with the loop's end before the last items are yielded: what
        it puts in ``chunks`` is yielded too."""
        self._steps = steps
        self._chunks = chunks
        self._ended = ended
        self._context = contextvars.Context()
        self._wait: Await | None = None  # what the loop waits for, while it does

    @property
    def waiting(self) -> bool:
        """Whether the loop is in flight (not running, not ended)."""
        return self._wait is not None

    def items(self) -> Generator[Any, None, T]:
        """Yield every item put in ``chunks``, in order, until the loop ends; return its end.

        Raises:
            BaseException: what the loop raised, after the items put before it.
        """
        run = self._context.run
        try:
            self._wait = run(next, self._steps)
            while True:
                yield from self._chunks.take()
                if self._wait is STREAMED:
                    arrived: list[TaskResult] | None = []
                else:
                    arrived = self._chunks.wait(self._wait)
                if arrived is not None:
                    self._wait = None  # the loop runs: it waits for nothing
                    self._wait = run(self._steps.send, arrived)
        except GeneratorExit:  # the reader closed it: nothing more is yielded
            raise
        except StopIteration as stop:
            end = cast(T, stop.value)
            self._ended(end)
            yield from self._chunks.take()
            return end
        except BaseException:
            if self._wait is not None:  # the reader's interruption, not the loop's
                raise
            yield from self._chunks.take()
            raise

    def finish_elsewhere(self, name: str) -> None:
        """Drive the loop on, on a thread of its own, from where it waits (nothing if it is
        over); what it then returns or raises is dropped: nobody reads it any more."""
        wait, self._wait = self._wait, None
        if wait is None:
            return

        def rest() -> None:
            try:
                self._context.run(drive, self._steps, wait)
            except BaseException as exc:  # an abandoned run stops so
                log.debug("a run whose reader stopped ended with %r", exc)

        threading.Thread(target=rest, name=name, daemon=True).start()
