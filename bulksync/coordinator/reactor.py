"""Many runs on a few threads: a loop holds a thread only while it has work to do.

A run spends nearly all of its life waiting for its tasks on the workers. Driven by
blocking (``inbox.drive``) each waiting run holds a thread; the coordinator service drives
hundreds of runs at once, so instead each run's loop generator (``SuperstepLoop.steps``) is
moved on by the :class:`Reactor`: when a result reaches a run's inbox, or its step's
deadline passes, one of the reactor's ``threads`` sends the run on until it waits again,
then goes to the next run that has work. A run is only ever moved on by one thread at a
time, and its results are handled in the order they arrived.

What a run does between two waits — applying writes, committing the checkpoint to
Postgres, publishing the next step, writing its events to Redis — still happens on a
reactor thread, so the pool's size bounds how many runs do it at once (and the database
and Redis connections they need). A subgraph node still runs its child loop on a thread
of its own (``nested.start_subgraph_task``).
"""

from __future__ import annotations

import collections
import contextvars
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from bulksync.coordinator.inbox import Await, Steps

log = logging.getLogger("bulksync.coordinator")

T = TypeVar("T")


class Reactor:
    """Drives loop generators on ``threads`` threads, until :meth:`close`."""

    def __init__(self, threads: int, *, name: str = "bulksync-reactor") -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._name = name
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._timer_cond = threading.Condition()
        self._timer_thread: threading.Thread | None = None
        self._closed = False
        self._local = threading.local()  # ``after``: what ``when_waiting`` keeps, per thread

    def start(
        self, steps: Steps[T], done: Callable[[T | None, BaseException | None], None]
    ) -> None:
        """Move ``steps`` on from now; ``done`` is called once, on a reactor thread, with
        the value it returns or the exception it raises."""
        _Driven(self, steps, done).kick()

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on a reactor thread (work that must not hold the caller's); nothing
        once the reactor is closed (its runs go to another coordinator)."""
        if self._closed:
            return
        try:
            self._pool.submit(_logged, fn)
        except RuntimeError:  # closed meanwhile
            log.debug("reactor %s closed: %s dropped", self._name, fn)

    def when_waiting(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once the run this thread moves on next waits (for its tasks, having
        published them) or ends: work that must not slow its step, such as writing its
        events. Off a run's turn (another thread, a ``Serial``), at once."""
        after: list[Callable[[], Any]] | None = getattr(self._local, "after", None)
        if after is None:
            fn()
        else:
            after.append(fn)

    def _waits(self) -> None:
        """The run this thread moves on waits or ended: run what ``when_waiting`` kept."""
        after: list[Callable[[], Any]] | None = getattr(self._local, "after", None)
        while after:
            _logged(after.pop(0))

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a reactor thread in ``delay`` seconds."""
        with self._timer_cond:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), fn))
            if self._timer_thread is None:
                self._timer_thread = threading.Thread(
                    target=self._run_timers, name=f"{self._name}-timers", daemon=True
                )
                self._timer_thread.start()
            self._timer_cond.notify()

    def close(self) -> None:
        """Stop the timers; work already handed to the threads finishes first."""
        with self._timer_cond:
            self._closed = True
            self._timer_cond.notify()
        self._pool.shutdown(wait=False)

    def _run_timers(self) -> None:
        with self._timer_cond:
            while not self._closed:
                if not self._timers:
                    self._timer_cond.wait()
                    continue
                due = self._timers[0][0] - time.monotonic()
                if due > 0:
                    self._timer_cond.wait(due)
                    continue
                _, _, fn = heapq.heappop(self._timers)
                self.call(fn)


class _Driven(Generic[T]):
    """One loop generator, moved on by whichever reactor thread it was handed to."""

    def __init__(
        self,
        reactor: Reactor,
        steps: Steps[T],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        self._reactor = reactor
        self._steps = steps
        self._done = done
        self._wait: Await | None = None
        # Its own context, as a thread of its own would have: what one run sets (a node's
        # callbacks, say) never shows in another's.
        self._context = contextvars.Context()
        self._started = False
        self._finished = False
        self._lock = threading.Lock()
        self._busy = False  # a thread is moving it on
        self._again = False  # something happened meanwhile: look once more before leaving

    def kick(self) -> None:
        """Something happened (a result, a deadline): have a thread look at the run."""
        with self._lock:
            if self._finished:
                return
            if self._busy:
                self._again = True
                return
            self._busy = True
        self._reactor.call(self._turn)

    def _turn(self) -> None:
        local = self._reactor._local
        local.after = []
        try:
            while True:
                with self._lock:
                    self._again = False
                self._context.run(self._advance)
                with self._lock:
                    if self._finished or not self._again:
                        self._busy = False
                        return
        finally:
            self._reactor._waits()
            local.after = None

    def _advance(self) -> None:
        """Send the run on until it waits with nothing arrived, or ends."""
        try:
            if not self._started:
                self._started = True
                self._waiting(next(self._steps))
            while self._wait is not None:
                wait = self._wait
                wait.inbox.wake = self.kick
                got = wait.inbox.ready(wait.limit)
                if not got and not wait.expired():
                    return
                self._waiting(self._steps.send(got))
        except StopIteration as stop:
            self._end(stop.value, None)
        except BaseException as exc:  # the run's own failure: its caller decides
            self._end(None, exc)

    def _waiting(self, wait: Await) -> None:
        last = self._wait  # a timer per deadline: a step's own, or its kept writes' (loop.py)
        fresh = last is None or last.inbox is not wait.inbox or last.deadline != wait.deadline
        if wait.deadline is not None and fresh:
            self._reactor.later(max(0.0, wait.deadline - time.monotonic()), self.kick)
        self._wait = wait
        self._reactor._waits()

    def _end(self, value: T | None, error: BaseException | None) -> None:
        with self._lock:
            self._finished = True
        self._wait = None
        done, self._done = self._done, _ended
        done(value, error)


def _ended(value: Any, error: BaseException | None) -> None:
    """What a finished run's ``done`` becomes: the run's objects are not kept alive by a
    reference from its reactor entry (an inbox still holds ``kick``)."""


class Serial:
    """Callables run one at a time, in the order given, on a reactor's threads."""

    def __init__(self, reactor: Reactor) -> None:
        self._reactor = reactor
        self._queue: collections.deque[Callable[[], Any]] = collections.deque()
        self._lock = threading.Lock()
        self._busy = False

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` after every callable submitted before it."""
        with self._lock:
            self._queue.append(fn)
            if self._busy:
                return
            self._busy = True
        self._reactor.call(self._run)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._busy = False
                    return
                fn = self._queue.popleft()
            _logged(fn)


def _logged(fn: Callable[[], Any]) -> None:
    """Run ``fn``; a bug in it is logged, not lost in a future nobody reads."""
    try:
        fn()
    except Exception:
        log.exception("reactor: %s failed", getattr(fn, "__qualname__", fn))
