"""The Celery side of a node task: read the step by reference, run, record the first result.

One Celery message carries one or more tasks of one node (small Send tasks are batched),
as ``[graph id, subgraph path, step key, run id, timeout, [task descriptor, …]]``; or, joined
by the coordinator's outbox, one task of each of several steps, as ``[graph id, subgraph path,
[[step key, run id, timeout, [task descriptor]], …]]`` (``run_joined``). For each task the
worker reads the step's shared input (once per step per process: it is cached) and the
task's input from the step hash, runs it with ``remote.RemoteStep`` (bytes in, bytes out:
the part any transport shares), and records the result with one atomic script
(``recorder.py``): the first result for a task id is kept, and whichever delivery arrives
reports *that* result to the step's inbox. A task that already has a result is not run again,
and a task runs only under its claim (``claims.py``): a second delivery of a task a live
worker runs leaves it be. How the tasks of one message run — together when they wait — is
``delivery.py``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import redis
from celery import Celery

from bulksync import keys, logs
from bulksync.coordinator.executor import TaskResult
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import (
    NodeFailedError,
    TaskCancelledError,
    UnknownGraphError,
)
from bulksync.retry import is_transient_redis, redis_client, retry
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.celery import claims
from bulksync.workers.celery.claims import Held
from bulksync.workers.celery.coordinator_saver import CoordinatorSaver
from bulksync.workers.celery.delivery import (
    SKIPPED,
    Delivery,
    Todo,
    first_claims,
    release_unused,
)
from bulksync.workers.celery.recorder import Record, Recorder
from bulksync.workers.celery.starts import StartCounter
from bulksync.workers.celery.stopper import TaskStopper
from bulksync.workers.registry import GraphRegistry, task_name, walk_specs
from bulksync.workers.remote import RemoteStep

log = logging.getLogger(__name__)

T = TypeVar("T")

IO_THREADS: Final = 32
"""Threads of a worker process's event loop for the Redis calls around its async tasks."""

MESSAGE_HEADER: Final = "bulksync"
"""Header marking a message as a bulksync node-task message (its value: the graph id)."""

_MessageRead = tuple[
    RemoteStep, list[Any], list[Any], dict[str, Any], Sequence[wire.TaskDescriptor]
]
"""What ``_read_message`` found: the step, each task's input and result (None: none yet),
the claims it took by slot, and the tasks it asked to claim."""


class WorkerRuntime:
    """What the node tasks of this process share: the graphs, Redis, a cache of step inputs."""

    def __init__(self, registry: GraphRegistry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.redis_url = settings.redis_url
        self._clients: dict[int, redis.Redis] = {}
        self._states: OrderedDict[str, RemoteStep] = OrderedDict()
        self._claims: dict[int, claims.ClaimKeeper] = {}
        self._recorders: dict[int, Recorder] = {}
        self._stoppers: dict[int, TaskStopper] = {}
        self._starts: dict[int, StartCounter] = {}
        self._pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
        self._loops: dict[int, asyncio.AbstractEventLoop] = {}
        self._lock = threading.RLock()  # (a thing made may need another: the client)
        self._waiting: set[str] = set()  # nodes whose last sync task here waited

    def _own(self, field: str, make: Callable[[], T]) -> T:
        """This process's thing in the ``{pid: thing}`` attribute ``field``, made on first
        use by ``make`` (once, whatever the threads); one a parent made before the fork is
        dropped, never used."""
        pid = os.getpid()
        found: T | None = getattr(self, field).get(pid)
        if found is None:
            with self._lock:
                found = getattr(self, field).get(pid)
                if found is None:
                    found = make()
                    setattr(self, field, {pid: found})
        return found

    def redis(self) -> redis.Redis:
        """This process's Redis client (a pool forked from a parent is never reused).

        Its pool has a connection for each thread that may call Redis at once: the worker
        pool's, the task threads, the event loop's I/O threads, the heartbeats (they open
        only when used); a call finding none free waits for one rather than failing.
        """
        pool = (self.settings.concurrency or os.cpu_count() or 1) + self.settings.task_threads
        return self._own("_clients", lambda: redis_client(self.redis_url, pool + IO_THREADS + 4))

    def run_message(
        self,
        graph_id: str,
        path: Sequence[str],
        step_key: str,
        run_id: str,
        timeout: float | None,
        descs: list[Any] | str,
    ) -> int:
        """Run the tasks of one message; return how many ran here (not cancelled or known).

        ``descs`` lists the task descriptors, or names the step-hash field holding them.
        """
        spec = self.registry.spec(graph_id, path)
        r = self.redis()
        descs = self.descriptors(step_key, descs)
        first, counted = first_claims(descs, spec, self.settings, timeout)
        read = self._read_message(spec, step_key, run_id, descs, first, counted)
        if read is None:
            return 0  # the run was cancelled, or the step is over: nobody waits for results
        step, fields, known, claimed, first = read

        def sink(namespace: Sequence[str], mode: str, chunk: Any) -> None:
            wire.report(r, step_key, wire.EVENT + wire.dumps_event(namespace, mode, chunk))

        live = step.live(sink, CoordinatorSaver(r, step_key))
        todo, finished = [], []
        for desc, data, result in zip(descs, fields, known, strict=True):
            if result is None:
                todo.append((desc, data))
            else:
                finished.append(Record(step_key, desc.slot, result))
        self.recorder().write(finished)
        is_async = bool(todo) and spec.nodes[todo[0][0].node].is_async
        reserved = {d.slot for d in first[counted:]}  # (none when the read was retried)
        name = task_name(graph_id, path, descs[0].node) if descs else ""
        delivery = Delivery(self, step_key, run_id, timeout, step, live, claimed, reserved, name)
        return _ran(delivery.run(todo, is_async), run_id, step, len(descs))

    def _read_message(
        self,
        spec: GraphSpec,
        step_key: str,
        run_id: str,
        descs: Sequence[wire.TaskDescriptor],
        first: Sequence[wire.TaskDescriptor],
        counted: int,
    ) -> _MessageRead | None:
        """Read a message's step, its tasks' inputs and results, and claim its ``first``
        tasks, in one round trip; None when the run was cancelled or the step is over (the
        claims taken are released)."""
        r, keeper = self.redis(), self.claims()

        def read(claiming: Sequence[wire.TaskDescriptor]) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            pipe.exists(keys.cancel(run_id))
            pipe.hmget(
                keys.step(step_key),
                [keys.STATE_FIELD, *(keys.task_input_field(d.id) for d in descs)],
            )
            pipe.mget([keys.result(d.slot) for d in descs])
            keeper.ask(pipe, [d.slot for d in claiming], run_id, step_key, counted=counted)
            return pipe.execute()

        # The first claims ride along, once: retried, a claim whose reply was lost would come
        # back held by this very process. After a failure the step is read again without
        # them, and the tasks are claimed as they run (a claim the failed read took expires,
        # and the coordinator publishes its task again, as after any lost claim).
        try:
            cancelled, fields, known, *asked = read(first)
        except redis.RedisError as exc:
            if not is_transient_redis(exc):
                raise
            first, asked = [], []
            cancelled, fields, known = self.retry(lambda: read(()), f"reading step {step_key}")
        replies = keeper.answers(asked)
        claimed = {d.slot: reply for d, reply in zip(first, replies, strict=True)}
        if cancelled or fields[0] is None:
            release_unused(keeper, claimed)
            return None
        try:
            step = self._state(step_key, spec, fields[0])
        except Exception as exc:  # the step's input cannot be read here: its tasks fail
            release_unused(keeper, claimed)
            exc.add_note(f"While reading step {step_key} for node '{descs[0].node}'")
            self._fail(step_key, descs, exc)
            raise  # (after the results: Celery and Flower see the message fail)
        return step, fields[1:], known, claimed, first

    def run_joined(self, graph_id: str, path: Sequence[str], groups: list[Any]) -> int:
        """Run a message that joins the one-task messages of several steps (``outbox.py``);
        return how many tasks ran here.

        Each group runs as its own message would, on the process's task threads: one by one
        while each ends within ``parallel_after``; once one takes longer (a model or tool
        call, or a computation), the rest start at once, so no run's task waits on another
        run's slow one. Every group runs whatever became of another; then the first failure
        fails the message (each was logged with its run's ids).
        """
        pool, ran, failures = self.task_pool(), 0, []
        running: list[concurrent.futures.Future[int]] = []
        for i, group in enumerate(groups):
            future = pool.submit(self.run_message, graph_id, path, *group)
            try:
                future.exception(timeout=self.settings.parallel_after)
            except concurrent.futures.TimeoutError:
                running = [future] + [
                    pool.submit(self.run_message, graph_id, path, *g) for g in groups[i + 1 :]
                ]
                break
            running.append(future)
        for future in running:
            try:
                ran += future.result()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
        return ran

    def learn(self, task_name: str, *, waited: bool) -> None:
        """Note whether the last sync task of node ``task_name`` run here waited (a model or
        tool call): a message of a node that waits runs its tasks at once (``delivery.py``)."""
        if waited:
            self._waiting.add(task_name)
        else:
            self._waiting.discard(task_name)

    def waits(self, task_name: str) -> bool:
        """Whether the last sync task of node ``task_name`` run here waited (``learn``)."""
        return task_name in self._waiting

    def task_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """This process's threads for running a message's tasks at once (never a parent's)."""
        return self._own(
            "_pools",
            lambda: concurrent.futures.ThreadPoolExecutor(
                self.settings.task_threads, thread_name_prefix="bulksync-task"
            ),
        )

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """This process's event loop for async nodes, on a thread of its own (started on
        first use; never a parent's): the async tasks of every message run there together."""
        return self._own("_loops", _started_loop)

    def claims(self) -> claims.ClaimKeeper:
        """This process's task claims and their heartbeat (never shared with a parent)."""
        return self._own("_claims", lambda: claims.ClaimKeeper(self.redis(), self.settings))

    def recorder(self) -> Recorder:
        """This process's writer of task results (never shared with a parent)."""
        return self._own("_recorders", lambda: Recorder(self.redis(), self.settings))

    def starts(self) -> StartCounter:
        """This process's counter of task starts (never shared with a parent)."""
        return self._own("_starts", lambda: StartCounter(self.redis(), self.settings))

    def stopper(self) -> TaskStopper:
        """This process's watch for cancelled steps and runs (never shared with a parent)."""
        return self._own("_stoppers", lambda: TaskStopper(self.redis(), self.settings.cancel_poll))

    def descriptors(self, step_key: str, descs: list[Any] | str) -> list[wire.TaskDescriptor]:
        """The descriptors a message carries, read from the step hash when it names them."""
        if not isinstance(descs, str):
            return [wire.TaskDescriptor.unpack(d) for d in descs]
        data = self.redis().hget(keys.step(step_key), descs)
        return wire.loads_descs(data) if isinstance(data, bytes) else []  # None: step over

    def record(
        self,
        step_key: str,
        slot: str,
        result: bytes,
        *,
        keep: bool = True,
        claim: Held | None = None,
    ) -> bool:
        """Report ``result`` unless the slot has one (then report that); keep it if ``keep``;
        drop ``claim`` in the same script (``recorder.py``). True if ``result`` is the one
        reported."""
        (kept,) = self.recorder().write([Record(step_key, slot, result, keep, claim)])
        return kept

    def retry(self, call: Callable[[], Any], what: str) -> Any:
        """``call()``, retried through a Redis outage of up to ``retry_window`` seconds, so a
        task that ran is not lost (its message is acknowledged whatever happens)."""
        return retry(
            call, transient=is_transient_redis, window=self.settings.retry_window, what=what
        )

    def reject_unknown(self, message: Any) -> bool:
        """Answer a bulksync message for a graph or node not loaded here with an error result.

        Raises:
            ValueError: the message does not carry a node task's arguments (say which).
        """
        graph_id = (message.headers or {}).get(MESSAGE_HEADER)
        if not graph_id:
            return False
        groups = _node_groups(message)
        error = UnknownGraphError(
            f"no worker task '{message.headers.get('task')}': graph '{graph_id}' is not loaded "
            f"by this worker (loaded: {', '.join(self.registry.ids()) or 'none'}); start the "
            f"worker with --graph {graph_id}, from the same version of the module."
        )
        log.error("%s", error)
        for step_key, _, _, listed in groups:
            self._fail(step_key, self.descriptors(step_key, listed), error)
        return True

    def _fail(
        self, step_key: str, descs: Sequence[wire.TaskDescriptor], error: BaseException
    ) -> None:
        """Report ``error`` as the result of each of ``descs``, in one write (not kept: a
        retry of the run runs them again)."""
        self.recorder().write(
            [
                Record(
                    step_key,
                    d.slot,
                    wire.dumps_result(TaskResult(d.id, error=error), d.node),
                    False,
                )
                for d in descs
            ]
        )

    def _state(self, step_key: str, spec: GraphSpec, data: bytes) -> RemoteStep:
        with self._lock:
            state = self._states.get(step_key)
            if state is not None:
                self._states.move_to_end(step_key)
                return state
        state = RemoteStep(spec, data)
        with self._lock:
            self._states[step_key] = state
            while len(self._states) > self.settings.state_cache_size:
                self._states.popitem(last=False)
        return state


def _node_groups(message: Any) -> list[list[Any]]:
    """``[step key, run id, timeout, descriptors]`` of each step a node-task message serves
    (one, or several joined: ``outbox.py``), checked for shape (the descriptors are checked
    as they are read).

    Raises:
        ValueError: the message does not carry a node task's arguments (say which).
    """
    body = message.decode()
    args: Any = body[0] if isinstance(body, list | tuple) and body else None
    count = len(args) if isinstance(args, list | tuple) else 0
    if count == 6:
        groups = [list(args[2:])]
    elif count == 3 and isinstance(args[2], list | tuple):
        groups = [list(g) if isinstance(g, list | tuple) else [g] for g in args[2]]
    else:
        raise ValueError(
            f"{count or 'no'} arguments where a node task has 6 (graph id, path, step, …), "
            "or 3, the last listing the steps of a joined message"
        )
    for group in groups:
        if len(group) != 4 or not isinstance(group[0], str) or not isinstance(group[3], list | str):
            raise ValueError("a step of the message is not [step key, run id, timeout, tasks]")
    return groups


def _ran(
    answers: Sequence[tuple[Todo, Any]],
    run_id: str,
    step: RemoteStep,
    size: int,
) -> int:
    """How many of a message's tasks ran here (not skipped); raises, once every result is
    recorded, when any failed, so that Celery (and Flower) see a FAILURE."""
    ran = 0
    failed: list[tuple[wire.TaskDescriptor, BaseException]] = []
    for (desc, _), error in answers:
        if error is SKIPPED:
            continue
        ran += 1
        if error is not None and not isinstance(error, TaskCancelledError):
            failed.append((desc, error))  # (a cancelled task was stopped on purpose)
    if failed:
        raise _failure(run_id, _thread_of(step), size, failed) from failed[0][1]
    return ran


def _thread_of(step: RemoteStep) -> str:
    return str((step.input.config.get("configurable") or {}).get("thread_id") or "-")


def _failure(
    run_id: str, thread: str, count: int, failed: list[tuple[wire.TaskDescriptor, BaseException]]
) -> NodeFailedError:
    """Log each failed task with its ids; the error that fails the Celery task.

    It names the first failed task; raised from that task's error, Celery's log line
    carries the node's own traceback.
    """
    for desc, error in failed:
        log.error(
            "run %s thread %s step %d node %s task %s failed: %s: %s",
            run_id or "-",
            thread,
            desc.step,
            desc.node,
            desc.id,
            type(error).__name__,
            error,
            extra=logs.ids(
                run_id=run_id, thread_id=thread, step=desc.step, node=desc.node, task_id=desc.id
            ),
        )
    desc, error = failed[0]
    more = f" ({len(failed)} of the message's {count} tasks failed)" if len(failed) > 1 else ""
    return NodeFailedError(
        f"node '{desc.node}' failed: {type(error).__name__}: {error} "
        f"[run={run_id or '-'} thread={thread} step={desc.step} task={desc.id}]{more}"
    )


def _started_loop() -> asyncio.AbstractEventLoop:
    """A new event loop running on a thread of its own, its threads doing the Redis calls
    around each async task."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(
        concurrent.futures.ThreadPoolExecutor(IO_THREADS, thread_name_prefix="bulksync-io")
    )
    started = threading.Event()
    loop.call_soon(started.set)
    threading.Thread(target=loop.run_forever, name="bulksync-async-nodes", daemon=True).start()
    started.wait()
    return loop


_runtime: WorkerRuntime | None = None


def current_runtime() -> WorkerRuntime | None:
    """The runtime installed in this process, if any."""
    return _runtime


def install(app: Celery, runtime: WorkerRuntime) -> list[str]:
    """Register a Celery task per node of every loaded graph; return their names."""
    global _runtime
    _runtime = runtime
    names = []
    for graph_id in runtime.registry.ids():
        for path, spec in walk_specs(runtime.registry.get(graph_id)):
            for node in spec.nodes:
                name = task_name(graph_id, path, node)
                if name not in app.tasks:
                    app.task(name=name, shared=False)(_node_task)
                names.append(name)
    return names


def _node_task(graph_id: str, path: list[str], *step: Any) -> int:
    """A node-task message: ``step`` is ``step key, run id, timeout, descriptors``, or the
    list of those of the steps a joined message serves."""
    runtime = current_runtime()
    if runtime is None:
        raise RuntimeError("bulksync worker runtime is not installed in this process")
    if len(step) == 1:
        return runtime.run_joined(graph_id, path, step[0])
    return runtime.run_message(graph_id, path, *step)
