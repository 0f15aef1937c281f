"""The ``@task`` calls a running node makes (the functional API): each a task of its own.

A call becomes a PUSH task of the caller's step. Its id is a pure function of the caller's
task id, the call's name and its index among the caller's calls, so a node run again after a
pause or a failure makes the same calls with the same ids: those that finished before
(``StepInput.returns``) hand back their stored result at once and do not run again.

Calls run concurrently, each on a thread of its own (they are model and tool calls, IO-bound:
threads are what they need, and a call waiting on its own calls never starves a pool); a
coroutine function called from a coroutine runs on the caller's event loop instead. Each
runs with its retry policy inside a ``TaskContext`` of its own, so ``interrupt``,
``get_config``, ``get_stream_writer`` and nested calls work there. A finished call streams
``{name: result}`` as an ``updates`` chunk at once; its writes (``__return__``, and the
``__resume__`` answers it consumed) are collected in a ``CallLog`` and travel back with the
caller's ``TaskResult``, where the loop stores them as the call's pending writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bulksync.cache.base import FullKey
from bulksync.constants import NS_SEP, PUSH, RESUME, RETURN
from bulksync.context import TaskContext, task_context
from bulksync.coordinator.cached import cache_key, cache_namespace
from bulksync.coordinator.executor import CallRecord
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import Write
from bulksync.coordinator.stream import task_path_key
from bulksync.errors import GraphInterrupt
from bulksync.ids import task_id
from bulksync.types import CachePolicy, RetryPolicy, TimeoutPolicy
from bulksync.workers.cancel_scope import run_coroutine
from bulksync.workers.messages import listening
from bulksync.workers.timeouts import AttemptClock, run_timed

ContextFor = Callable[[Task, list[Write], AttemptClock | None], TaskContext]
"""Builds the context a call runs in: its task, the list its ``__resume__`` writes go to, and
the clock of its attempt if it is timed."""


class CallLog:
    """The calls made under one node task (nested ones included), as they end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[CallRecord] = []

    def add(self, record: CallRecord) -> None:
        """A call ended (finished, or paused with the answers it consumed)."""
        with self._lock:
            self._records.append(record)

    def records(self) -> tuple[CallRecord, ...]:
        """The calls that ended so far."""
        with self._lock:
            return tuple(self._records)


_FIRST_CALL = threading.Lock()
"""Held while a task's ``Calls`` are built (rarely: at its first call, once)."""


class LazyCalls:
    """A running task's ``Calls``, built when it starts its first ``@task`` call: most nodes
    start none, and a fan-out of thousands of them keeps thousands of tasks in flight."""

    __slots__ = ("_build", "_built")

    def __init__(self, build: Callable[[], Calls]) -> None:
        self._build = build
        self._built: Calls | None = None

    def __call__(self) -> Calls:
        """The task's ``Calls``, built now if it has none yet."""
        built = self._built
        if built is None:
            with _FIRST_CALL:  # a node's threads may start their first calls at once
                if self._built is None:
                    self._built = self._build()
                built = self._built
        return built

    def ended(self) -> bool:
        """Whether every call started has ended (``join`` would not wait)."""
        return self._built is None or self._built.ended()

    def join(self) -> tuple[CallRecord, ...]:
        """Wait for the calls still running; every call that ended (``Calls.join``)."""
        return () if self._built is None else self._built.join()


class Calls:
    """Starts the ``@task`` calls of one running task (a node's, or a call's own)."""

    def __init__(
        self,
        caller: Task,
        returns: Any,
        context_for: ContextFor,
        log: CallLog,
        emit: Callable[[dict[str, Any]], None],
        started: Callable[[], None] | None = None,
        cache: Any = None,
    ) -> None:
        self.caller = caller
        self.returns = returns
        self.context_for = context_for
        self.log = log
        self.emit = emit
        self.started = started
        """Told of each call started (progress of the caller's timed attempt)."""
        self.cache = cache
        """The run's node cache: calls with a cache policy reuse results by arguments."""
        self._index = itertools.count()
        self._running: list[concurrent.futures.Future[Any]] = []

    def ended(self) -> bool:
        """Whether every call started has ended (``join`` would not wait)."""
        return all(future.done() for future in self._running)

    def join(self) -> tuple[CallRecord, ...]:
        """Wait for this task's calls still running on threads; every call that ended.

        A node that returns without reading a call's result still has that call finished
        and stored, as LangGraph does. Each call joins its own calls before it ends.
        """
        concurrent.futures.wait(self._running)
        return self.log.records()

    def submit(
        self,
        func: Callable[..., Any],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        *,
        name: str,
        retry_policy: Sequence[RetryPolicy] = (),
        timeout: TimeoutPolicy | None = None,
        cache_policy: CachePolicy | None = None,
    ) -> Any:
        """Start ``func(*args, **kwargs)`` as a call named ``name``; a future of its result.

        From a coroutine, the future is awaitable (an ``asyncio`` future); else it is a
        ``concurrent.futures.Future`` (``.result()`` blocks).
        """
        if self.started is not None:
            self.started()
        task = call_task(self.caller, name, next(self._index), timeout)
        loop = _running_loop()
        if task.id in self.returns:  # finished in an earlier attempt: not run again
            return _done(self.returns[task.id], loop)
        key = None
        if cache_policy is not None and self.cache is not None:
            key = cache_key(cache_namespace(name, func), cache_policy, *args, **kwargs)
            found = self.cache.get([key])
            if key in found:  # the result of an earlier call with these arguments
                self.emit({name: found[key]})
                return _done(found[key], loop)
        run = _CallRun(self, task, func, args, kwargs, retry_policy)
        run.cached = None if key is None else (key, cache_policy.ttl)  # type: ignore[union-attr]
        if loop is not None and inspect.iscoroutinefunction(func):
            return loop.create_task(run.run_async())
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._running.append(future)  # only the calling task's thread appends
        threading.Thread(target=run.run_sync, args=(future,), name=f"bulksync-call-{name}").start()
        return asyncio.wrap_future(future, loop=loop) if loop is not None else future


def call_task(caller: Task, name: str, index: int, timeout: TimeoutPolicy | None = None) -> Task:
    """The task of ``caller``'s ``index``-th call, named ``name`` (a sibling of the caller in
    its graph: same step, namespace under the caller's graph), timed by ``timeout``."""
    tid = task_id(caller.id, "call", name, str(index))
    graph_ns = caller.checkpoint_ns.rpartition(NS_SEP)[0]
    own = f"{name}:{tid}"
    return Task(
        id=tid,
        name=name,
        path=(PUSH, caller.path, index, caller.id, True),
        input=None,
        triggers=("__pregel_push",),
        step=caller.step,
        checkpoint_ns=f"{graph_ns}{NS_SEP}{own}" if graph_ns else own,
        timeout=timeout,
    )


class _CallRun:
    """One call, from its first attempt to its result."""

    def __init__(
        self,
        calls: Calls,
        task: Task,
        func: Callable[..., Any],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        retry_policy: Sequence[RetryPolicy],
    ) -> None:
        self.calls = calls
        self.task = task
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.retry_policy = retry_policy
        self.cached: tuple[FullKey, int | None] | None = None
        """Where the result goes in the node cache, and for how long."""

    def run_sync(self, future: concurrent.futures.Future[Any]) -> None:
        """Run on this thread; settle ``future`` with the result or the error."""
        attempt = 0
        while True:
            attempt += 1
            resumes: list[Write] = []
            ctx, nested, clock = self._context(resumes)
            try:
                with task_context(ctx), listening(ctx.config):
                    value = self.func(*self.args, **self.kwargs)
                    if inspect.isawaitable(value):
                        value = run_coroutine(self._timed(value, clock))
                nested.join()  # its own calls end before it does
            except BaseException as exc:
                delay = self._backoff(exc, attempt)
                if delay is not None:
                    time.sleep(delay)
                    continue
                self._ended(resumes, exc)
                future.set_exception(exc)
                return
            self._ended(resumes, None, value)
            future.set_result(value)
            return

    async def run_async(self) -> Any:
        """Run on the caller's event loop; the result, or the error raised."""
        attempt = 0
        while True:
            attempt += 1
            resumes: list[Write] = []
            ctx, nested, clock = self._context(resumes)
            try:
                # An asyncio task has its own copy of the context: these stay in it.
                with task_context(ctx), listening(ctx.config):
                    value = await self._timed(self.func(*self.args, **self.kwargs), clock)
                if not nested.ended():  # its calls on threads end before it does
                    await asyncio.to_thread(nested.join)
            except BaseException as exc:
                delay = self._backoff(exc, attempt)
                if delay is not None:
                    await asyncio.sleep(delay)  # the caller's loop runs on meanwhile
                    continue
                self._ended(resumes, exc)
                raise
            self._ended(resumes, None, value)
            return value

    def _context(self, resumes: list[Write]) -> tuple[TaskContext, LazyCalls, AttemptClock | None]:
        """An attempt's context, the calls it starts, and its clock if the call is timed."""
        policy = self.task.timeout
        clock = AttemptClock(policy) if policy is not None else None
        ctx = self.calls.context_for(self.task, resumes, clock)
        calls = self.calls
        started = clock.progress if clock is not None else None
        nested = LazyCalls(
            functools.partial(
                Calls,
                self.task,
                calls.returns,
                calls.context_for,
                calls.log,
                calls.emit,
                started,
                calls.cache,
            )
        )
        ctx.call_starter = nested
        return ctx, nested, clock

    def _timed(self, awaitable: Any, clock: AttemptClock | None) -> Any:
        return awaitable if clock is None else run_timed(awaitable, clock, self.task.name)

    def _backoff(self, exc: BaseException, attempt: int) -> float | None:
        """The seconds to wait before retrying after ``exc``; None when no policy retries."""
        if not isinstance(exc, Exception) or isinstance(exc, GraphInterrupt):
            return None
        policy = next((p for p in self.retry_policy if p.should_retry(exc)), None)
        if policy is None or attempt >= policy.max_attempts:
            return None
        return policy.delay(attempt)

    def _ended(self, resumes: list[Write], error: BaseException | None, value: Any = None) -> None:
        """Record what the call leaves behind: its answers, and its result if it finished."""
        writes: list[Write] = [(RESUME, w[1]) for w in resumes if w[0] == RESUME][-1:]
        if error is None:
            writes.append((RETURN, value))
            self.calls.emit({self.task.name: value})
            if self.cached is not None:
                key, ttl = self.cached
                self.calls.cache.set({key: (value, ttl)})
        elif not isinstance(error, GraphInterrupt):
            error.add_note(f"During task with name '{self.task.name}' and id '{self.task.id}'")
        if writes:
            path = task_path_key(self.task)
            self.calls.log.add(CallRecord(self.task.id, self.task.name, path, tuple(writes)))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _done(value: Any, loop: asyncio.AbstractEventLoop | None) -> Any:
    """A future already holding ``value`` (awaitable when made inside an event loop)."""
    if loop is not None:
        done: asyncio.Future[Any] = loop.create_future()
        done.set_result(value)
        return done
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_result(value)
    return future


__all__ = ["CallLog", "Calls", "LazyCalls", "call_task"]
