"""Cancelling what a step (or a caller) started: the async nodes it runs, the runs it reads.

In-process, the async nodes (and ``@task`` coroutines) of a run an async caller started
(``ainvoke``, ``astream``) run on that caller's event loop, as under LangGraph: they share
its asyncio objects and run concurrently there, while the task's thread waits. Those of a
run started from sync code run each on an event loop of its own, on its task's thread (and
so do those of a run that a coroutine on the caller's loop started with a blocking call,
which would otherwise wait for itself). A ``CancelScope`` knows the coroutines running
under it and the runs
started under it (a graph a node invokes, the run an ``astream`` reads), so cancelling it
cancels those coroutines (they see ``CancelledError`` at their next ``await``, as under
LangGraph) and abandons those runs, which cancel their own steps in turn. The scope travels
in a context variable: a step sets it for its tasks' threads, ``astream`` for the threads
that pull its run, and ``asyncio.to_thread`` carries it to a graph an async node invokes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from bulksync.constants import ASYNC_CALLER

logger = logging.getLogger(__name__)

STOP_WAIT = 10.0
"""Seconds a caller stopping a run waits for it to stop: its cancelled async nodes end at
once, a sync node cannot be stopped and is waited for only so long."""

_SCOPE: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar(
    "bulksync_cancel_scope", default=None
)


class CancelScope:
    """Coroutines and runs to stop together (thread-safe)."""

    def __init__(self, home: asyncio.AbstractEventLoop | None = None) -> None:
        self._lock = threading.Lock()
        self._tasks: set[_Running] = set()
        self._on_cancel: list[Callable[[], object]] = []
        self.cancelled = False
        self.home = home
        """The async caller's event loop, where the coroutines run under this scope run
        (None: each on a loop of its own)."""

    def cancel(self) -> None:
        """Cancel the running coroutines and wait (``STOP_WAIT`` at most) until they have
        ended; stop the runs. Work started under the scope later starts cancelled."""
        with self._lock:
            self.cancelled = True
            tasks, self._tasks = set(self._tasks), set()
            stops, self._on_cancel = self._on_cancel, []
        for running in tasks:
            running.loop.call_soon_threadsafe(running.task.cancel)
        for stop in stops:
            try:
                stop()
            except Exception:  # one run failing to stop must not keep the others going
                logger.exception("stopping a run under a cancelled scope failed")
        deadline = time.monotonic() + STOP_WAIT
        for running in tasks:
            if not running.on_this_thread():  # (a coroutine cannot wait for itself)
                running.wait(max(0.0, deadline - time.monotonic()))

    def on_cancel(self, stop: Callable[[], object]) -> None:
        """Call ``stop`` when this scope is cancelled (now, if it is already)."""
        with self._lock:
            if not self.cancelled:
                self._on_cancel.append(stop)
                return
        stop()

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to its end (in this thread's context): on the scope's home loop
        while this thread waits, else on an event loop of this thread's own."""
        home = usable_home(self.home)
        if home is not None:
            context = contextvars.copy_context()
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()

            def start() -> None:
                task = home.create_task(self.track(awaitable), context=context)
                task.add_done_callback(functools.partial(_settle, done))

            try:
                home.call_soon_threadsafe(start)
            except RuntimeError:  # closed meanwhile: run here after all
                pass
            else:
                return done.result()
        with asyncio.Runner() as runner:
            return runner.run(self.track(awaitable))

    async def track(self, awaitable: Awaitable[Any]) -> Any:
        """Await ``awaitable`` in the running task, which this scope cancels when it is."""
        task = asyncio.current_task()
        assert task is not None
        entry = _Running(asyncio.get_running_loop(), task)
        with self._lock:
            cancelled = self.cancelled
            if not cancelled:
                self._tasks.add(entry)
        if cancelled:
            task.cancel()
        try:
            return await awaitable
        finally:
            with self._lock:
                self._tasks.discard(entry)
            entry.end()


class _Running:
    """A coroutine running under a scope: its loop, its task, and whether it has ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop = loop
        self.task = task
        # Held until the coroutine ends: a lock costs a fraction of an Event, and each async
        # node's task makes one.
        self._running = threading.Lock()
        self._running.acquire()

    def end(self) -> None:
        """The coroutine ended."""
        self._running.release()

    def wait(self, timeout: float) -> None:
        """Wait until the coroutine has ended (``timeout`` seconds at most)."""
        if self._running.acquire(timeout=timeout):
            self._running.release()

    def on_this_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False


def _settle(done: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
    """Hand a task's outcome on home to the thread waiting for it."""
    if task.cancelled():
        done.set_exception(asyncio.CancelledError())
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


def usable_home(home: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop | None:
    """``home``, unless it cannot run coroutines for this thread: it is not running, or this
    very thread runs it (blocked in a sync call a coroutine there made)."""
    if home is None or home.is_closed() or not home.is_running():
        return None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return home
    return None if running is home else home


def current_home() -> asyncio.AbstractEventLoop | None:
    """The event loop the async nodes of a run started here run on: that of the async
    caller whose scope this code runs under, if it can take them (``usable_home``)."""
    scope = _SCOPE.get()
    return usable_home(scope.home) if scope is not None else None


def mark_async_caller(configurable: dict[str, Any], *, inherited: bool = True) -> None:
    """Mark a new run's ``configurable`` as started by an async caller (``ASYNC_CALLER``).

    A mark already there is dropped when ``inherited`` (the config of a node starting a run
    of its own), and kept when a client sent it (a run a service runs for a caller)."""
    if inherited:
        configurable.pop(ASYNC_CALLER, None)
    if current_home() is not None:
        configurable[ASYNC_CALLER] = True


def current_scope() -> CancelScope | None:
    """The scope the caller runs under, if any."""
    return _SCOPE.get()


@contextlib.contextmanager
def within(scope: CancelScope) -> Iterator[None]:
    """Run the block under ``scope``."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def scoped_context(
    home: asyncio.AbstractEventLoop | None = None,
) -> tuple[CancelScope, contextvars.Context]:
    """A new scope (its coroutines run on ``home``), and a copy of the caller's context that
    runs under it (for work handed to another thread)."""
    scope = CancelScope(home)
    context = contextvars.copy_context()
    context.run(_SCOPE.set, scope)
    return scope, context


def run_coroutine(awaitable: Awaitable[Any]) -> Any:
    """Run ``awaitable`` to its end on an event loop of its own, cancellable by the
    caller's scope."""
    scope = current_scope()
    return (scope or CancelScope()).run(awaitable)
