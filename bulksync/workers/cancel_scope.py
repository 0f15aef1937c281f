"""Cancelling what a step (or a caller) started: the async nodes it runs, the runs it reads.

In-process, each async node (and ``@task`` coroutine) runs on an event loop of its own, on
its task's thread. A ``CancelScope`` knows the coroutines running under it and the runs
started under it (a graph a node invokes, the run an ``astream`` reads), so cancelling it
cancels those coroutines (they see ``CancelledError`` at their next ``await``, as under
LangGraph) and abandons those runs, which cancel their own steps in turn. The scope travels
in a context variable: a step sets it for its tasks' threads, ``astream`` for the threads
that pull its run, and ``asyncio.to_thread`` carries it to a graph an async node invokes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

STOP_WAIT = 10.0
"""Seconds a caller stopping a run waits for it to stop: its cancelled async nodes end at
once, a sync node cannot be stopped and is waited for only so long."""

_SCOPE: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar(
    "bulksync_cancel_scope", default=None
)


class CancelScope:
    """Coroutines and runs to stop together (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: set[_Running] = set()
        self._on_cancel: list[Callable[[], object]] = []
        self.cancelled = False

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
                running.ended.wait(max(0.0, deadline - time.monotonic()))

    def on_cancel(self, stop: Callable[[], object]) -> None:
        """Call ``stop`` when this scope is cancelled (now, if it is already)."""
        with self._lock:
            if not self.cancelled:
                self._on_cancel.append(stop)
                return
        stop()

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to its end on an event loop of this thread's own."""
        with asyncio.Runner() as runner:
            return runner.run(self._tracked(awaitable))

    async def _tracked(self, awaitable: Awaitable[Any]) -> Any:
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
            entry.ended.set()


class _Running:
    """A coroutine running under a scope: its loop, its task, and whether it has ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop = loop
        self.task = task
        self.ended = threading.Event()

    def on_this_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False


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


def scoped_context() -> tuple[CancelScope, contextvars.Context]:
    """A new scope, and a copy of the caller's context that runs under it (for work handed
    to another thread)."""
    scope = CancelScope()
    context = contextvars.copy_context()
    context.run(_SCOPE.set, scope)
    return scope, context


def run_coroutine(awaitable: Awaitable[Any]) -> Any:
    """Run ``awaitable`` to its end on an event loop of its own, cancellable by the
    caller's scope."""
    scope = current_scope()
    return (scope or CancelScope()).run(awaitable)
