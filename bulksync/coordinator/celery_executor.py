"""The cluster executor: a step's tasks as Celery messages, their results gathered from Redis.

``submit`` puts the step into Redis once (the claim check: one hash with the shared state
and each task's input), publishes the tasks over one producer connection — a node's small
Send tasks several per message — and starts a gatherer that blocks on the step's inbox
(``BLPOP``; no polling) and delivers results and custom events in arrival order. Tasks that
already have a recorded result (a coordinator restarted mid-step) are delivered from Redis
instead of running again.

A task that runs longer than its node's timeout (``add_node(..., timeout=)``, else the executor's
default; counted from when a worker starts it, not while it waits in a queue) is delivered
as ``TaskTimeoutError`` and its message revoked; the worker's hard time limit stops it.
Cancelling a run (:func:`cancel_run`) wakes every live step of the run; their unfinished
tasks are delivered as ``TaskCancelledError`` and revoked, and workers skip the run's
remaining tasks. If Redis restarts or loses the step's keys, the gatherer waits for it to
come back and dispatches the step's unfinished tasks again (results that survived count).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Final

import redis
from celery import Celery

from bulksync import keys, wire
from bulksync.coordinator.executor import StepInput, TaskResult
from bulksync.coordinator.nested import NestedInfo
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import TaskCancelledError, TaskTimeoutError, UnknownGraphError
from bulksync.settings import Settings
from bulksync.workers.app import make_app
from bulksync.workers.node_task import MESSAGE_HEADER
from bulksync.workers.registry import task_name, walk_specs

log = logging.getLogger(__name__)

TARGET_MESSAGES: Final = 128
"""A node's Send fan-out is split into about this many messages (fewer for small fan-outs)."""

MAX_BATCH: Final = 64
"""At most this many tasks ride one message."""

_DRAIN: Final = 1000
_RECONNECT_WAIT: Final = 0.5
_IDLE_WAIT: Final = 2.0  # below redis-py's 5 s socket timeout


def batch_size(count: int, limit: int = MAX_BATCH) -> int:
    """Tasks per message for a fan-out of ``count`` tasks of one node."""
    return max(1, min(limit, math.ceil(count / TARGET_MESSAGES)))


class CeleryExecutor:
    """Runs each step's tasks on Celery workers that loaded the same graph.

    ``graph_id`` is how workers know the graph (``pkg.module:attr``, as given to
    ``bulksync worker --graph``); ``graph`` is the compiled graph this process runs.
    """

    def __init__(
        self,
        settings: Settings,
        graph_id: str,
        graph: Any,
        *,
        app: Celery | None = None,
        default_timeout: float | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.settings = settings
        self.graph_id = graph_id
        self.app = app or make_app(settings)
        self.default_timeout = default_timeout or settings.task_timeout
        self.max_batch = max_batch
        self.redis = redis.Redis.from_url(settings.redis_url)
        self._paths = {id(spec): path for path, spec in walk_specs(graph)}

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> CeleryStep:
        """Publish ``tasks``; a gatherer thread delivers their results as they arrive."""
        path = self._paths.get(id(spec))
        if path is None:
            raise UnknownGraphError(
                f"graph '{spec.name}' is not part of '{self.graph_id}'; give each graph its "
                "own CeleryExecutor."
            )
        run_id = str(step.config.get("run_id") or "")
        handle = CeleryStep(self, spec, step, tasks, deliver, run_id)
        handle.start(path)
        return handle


class CeleryStep:
    """One dispatched step: its Redis keys, its messages and its gatherer."""

    def __init__(
        self,
        executor: CeleryExecutor,
        spec: GraphSpec,
        step: StepInput,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
        run_id: str,
    ) -> None:
        self.ex = executor
        self.spec = spec
        self.step = step
        self.tasks = {t.id: t for t in tasks}
        self.deliver = deliver
        self.run_id = run_id
        self.key = uuid.uuid4().hex
        self.pending = set(self.tasks)
        self.slots: dict[str, str] = {}
        self.messages: dict[str, list[str]] = {}  # Celery message id -> task ids
        self.deadlines: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopped = False

    # -- dispatch ---------------------------------------------------------------------

    def start(self, path: tuple[str, ...]) -> None:
        """Store the step, deliver known results, publish the rest, start gathering."""
        self.path = path
        self.state = wire.StepState(
            channel_values=self.step.channel_values,
            config=self.step.config,
            stop=self.step.stop,
            resume=self.step.resume,
            resume_map=self.step.resume_map,
            null_resume=self.step.null_resume.peek(),
            namespace=self.step.namespace,
            nesting=_nesting(self.step.nested),
        )
        self.slots = {t: wire.slot(t, self.state) for t in self.tasks}
        self._dispatch(list(self.tasks))
        threading.Thread(
            target=self._gather, name=f"bulksync-gather-{self.key[:8]}", daemon=True
        ).start()

    def _dispatch(self, ids: list[str]) -> None:
        """Store the step for ``ids``, deliver those with a result, publish the others."""
        r = self.ex.redis
        known: list[Any] = r.mget([keys.result(self.slots[t]) for t in ids]) if ids else []
        todo = [self.tasks[t] for t, res in zip(ids, known, strict=True) if res is None]
        mapping: dict[Any, Any] = {keys.STATE_FIELD: wire.dumps_state(self.state)}
        mapping.update({keys.task_input_field(t.id): wire.dumps_input(t.input, t) for t in todo})
        batches = self._batches(todo)
        # A batch's descriptors ride in the step hash too: a message stays small at any width.
        mapping.update(
            {
                keys.batch_field(m): wire.dumps_descs([self._describe(t) for t in c])
                for _, m, c in batches
                if len(c) > 1
            }
        )
        pipe = r.pipeline(transaction=False)
        pipe.hset(keys.step(self.key), mapping=mapping)
        pipe.expire(keys.step(self.key), keys.STEP_TTL)
        if self.run_id:
            pipe.sadd(keys.run_inboxes(self.run_id), keys.inbox(self.key))
            pipe.expire(keys.run_inboxes(self.run_id), keys.RUN_TTL)
            pipe.exists(keys.cancel(self.run_id))
        stored = pipe.execute()
        cancelled = bool(stored[-1]) if self.run_id else False
        for res in known:
            if res is not None:
                self._deliver(wire.loads_result(res))
        if cancelled:
            self.cancel()
        elif batches:
            self._publish(self.path, batches)

    def _describe(self, task: Task) -> list[Any]:
        return wire.describe_task(task, self.slots[task.id])

    def _batches(self, todo: list[Task]) -> list[tuple[str, str, list[Task]]]:
        """``(node, message id, tasks)`` per message: a node's Send tasks several at a time."""
        by_node: dict[str, list[Task]] = defaultdict(list)
        for task in todo:
            by_node[task.name].append(task)
        out = []
        for node, group in by_node.items():
            size = batch_size(len(group), self.ex.max_batch) if group[0].is_push else 1
            for i in range(0, len(group), size):
                out.append((node, uuid.uuid4().hex, group[i : i + size]))
        return out

    def _publish(self, path: tuple[str, ...], batches: list[tuple[str, str, list[Task]]]) -> None:
        thread = (self.step.config.get("configurable") or {}).get("thread_id", "")
        with self.ex.app.producer_or_acquire() as producer:
            for node, message_id, chunk in batches:
                spec = self.spec.nodes[node]
                timeout = spec.timeout or self.ex.default_timeout
                with self._lock:
                    self.messages[message_id] = [t.id for t in chunk]
                descs: Any = (
                    keys.batch_field(message_id)
                    if len(chunk) > 1
                    else [self._describe(t) for t in chunk]
                )
                self.ex.app.send_task(
                    task_name(self.ex.graph_id, path, node),
                    args=[self.ex.graph_id, list(path), self.key, self.run_id, timeout, descs],
                    task_id=message_id,
                    queue=spec.queue or self.ex.settings.queue,
                    producer=producer,
                    headers={MESSAGE_HEADER: self.ex.graph_id},
                    argsrepr=_describe(self.run_id, thread, chunk),
                    kwargsrepr="{}",
                    time_limit=(timeout * len(chunk) + 10) if timeout else None,
                )

    # -- gather -----------------------------------------------------------------------

    def _gather(self) -> None:
        r = redis.Redis(connection_pool=self.ex.redis.connection_pool)
        inbox = keys.inbox(self.key)
        try:
            while self._open():
                try:
                    self._gather_once(r, inbox)
                except redis.ConnectionError as exc:
                    log.warning("step %s: Redis unreachable (%s); retrying", self.key, exc)
                    time.sleep(_RECONNECT_WAIT)  # back off before reconnecting
        finally:
            try:
                pipe = r.pipeline(transaction=False)
                pipe.delete(keys.step(self.key), inbox)
                if self.run_id:
                    pipe.srem(keys.run_inboxes(self.run_id), inbox)
                pipe.execute()
            except redis.ConnectionError:  # the keys expire on their own
                log.warning("step %s: could not drop its Redis keys", self.key)

    def _gather_once(self, r: redis.Redis, inbox: str) -> None:
        """Wait for the inbox; handle what arrived, or check deadlines and the step's keys."""
        item = r.blpop([inbox], timeout=self._next_deadline_wait())
        if item is None:
            self._expire()
            if self._open() and not r.exists(keys.step(self.key)):
                self._recover()
            return
        for entry in [item[1], *(r.lpop(inbox, _DRAIN) or [])]:
            self._handle(entry)

    def _recover(self) -> None:
        """The step's keys are gone (Redis restarted or lost them): dispatch it again.

        Results that survived are delivered from their slots; the other unfinished tasks
        are published again (a task still running elsewhere records under the same slot,
        and the first result wins).
        """
        with self._lock:
            left = sorted(self.pending)
        log.warning(
            "step %s: its Redis state is gone; dispatching %d unfinished tasks again",
            self.key,
            len(left),
        )
        self._dispatch(left)

    def _open(self) -> bool:
        with self._lock:
            return bool(self.pending) and not self._stopped

    def _handle(self, entry: bytes) -> None:
        kind, data = entry[:1], entry[1:]
        if kind == wire.RESULT:
            self._deliver(wire.loads_result(data))
        elif kind == wire.STARTED:
            self._started(data.decode())
        elif kind == wire.EVENT:
            self.step.sink(*wire.loads_event(data))
        elif kind == wire.CANCEL:
            self.cancel()

    def _deliver(self, result: TaskResult) -> None:
        with self._lock:
            if result.task_id not in self.pending:
                return
            self.pending.discard(result.task_id)
        self.deliver(result)

    def _started(self, task_id: str) -> None:
        task = self.tasks.get(task_id)
        if task is None:
            return
        timeout = self.spec.nodes[task.name].timeout or self.ex.default_timeout
        if timeout:
            with self._lock:
                self.deadlines.setdefault(task_id, time.monotonic() + timeout)

    def _next_deadline_wait(self) -> float:
        with self._lock:
            live = [self.deadlines[t] for t in self.pending if t in self.deadlines]
        if not live:
            return _IDLE_WAIT
        return max(0.01, min(live) - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [t for t in self.pending if self.deadlines.get(t, math.inf) <= now]
        if not late:
            return
        self._revoke(late)
        for task_id in late:
            task = self.tasks[task_id]
            limit = self.spec.nodes[task.name].timeout or self.ex.default_timeout
            self._deliver(
                TaskResult(
                    task_id,
                    error=TaskTimeoutError(
                        f"node '{task.name}': task {task_id} ran longer than its {limit:g}s "
                        "timeout; raise it with add_node(..., timeout=) or "
                        "BULKSYNC_TASK_TIMEOUT, or look for a hung call in the node."
                    ),
                )
            )

    # -- cancel -----------------------------------------------------------------------

    def cancel(self) -> None:
        """Revoke the unfinished tasks and deliver them as cancelled."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            left = sorted(self.pending)
        self._revoke(left)
        for task_id in left:
            self._deliver(TaskResult(task_id, error=TaskCancelledError(task_id)))
        wake = self.ex.redis.pipeline(transaction=False)
        wake.rpush(keys.inbox(self.key), wire.CANCEL)  # wake the gatherer
        wake.expire(keys.inbox(self.key), keys.STEP_TTL)
        wake.execute()

    def _revoke(self, task_ids: Sequence[str]) -> None:
        wanted = set(task_ids)
        with self._lock:
            ids = [m for m, tids in self.messages.items() if wanted.intersection(tids)]
        if ids:
            self.ex.app.control.revoke(ids)


def cancel_run(client: redis.Redis, run_id: str) -> None:
    """Cancel ``run_id`` on the cluster: workers skip its tasks, its live steps stop."""
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.cancel(run_id), b"1", ex=keys.RUN_TTL)
    pipe.smembers(keys.run_inboxes(run_id))
    inboxes = pipe.execute()[1]
    if inboxes:
        pipe = client.pipeline(transaction=False)
        for inbox in inboxes:
            pipe.rpush(inbox, wire.CANCEL)
            pipe.expire(inbox, keys.STEP_TTL)
        pipe.execute()


def _describe(run_id: str, thread: str, chunk: Sequence[Task]) -> str:
    """What Flower shows for a message: ids, never the state."""
    first = chunk[0]
    tasks = first.id if len(chunk) == 1 else f"{first.id} +{len(chunk) - 1}"
    return (
        f"run={run_id or '-'} thread={thread or '-'} step={first.step} node={first.name} "
        f"task={tasks}"
    )


def _nesting(info: NestedInfo | None) -> wire.Nesting | None:
    """The part of a loop's nesting context that can travel to a worker."""
    if info is None:
        return None
    return wire.Nesting(
        recursion_limit=info.options.recursion_limit,
        durability=info.options.durability,
        modes=tuple(sorted(info.options.modes)),
        resuming=info.resuming,
        checkpoint_map=dict(info.checkpoint_map),
    )
