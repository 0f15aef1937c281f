"""One step on the cluster (``CeleryStep``): stored in Redis, published, gathered, recovered.

The executor (``executor.py``) makes one per step it submits. Dispatching stores the step's
state and inputs and publishes its messages in one round trip; the executor's gatherer hands
the step its reports from the executor's inbox (``receive``), and asks the step, every few
moments, to look at its tasks' claims and deadlines and at keys Redis may have lost.
Cancelling revokes the unfinished tasks and waits for the async ones already running to stop.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from bulksync import collector, keys, logs
from bulksync.coordinator.executor import StepInput, StepLive, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import (
    GraphBubbleUp,
    TaskCancelledError,
    TaskTimeoutError,
    WorkerLostError,
)
from bulksync.retry import is_transient_redis, retry
from bulksync.workers import wire
from bulksync.workers.callback_relay import CALLBACK_EVENTS, replay
from bulksync.workers.cancel_scope import STOP_WAIT
from bulksync.workers.celery.claims import ClaimWatch, Survey
from bulksync.workers.celery.coordinator_saver import serve
from bulksync.workers.celery.gatherer import FORGET_BATCH, Backlog
from bulksync.workers.celery.outbox import Outbox
from bulksync.workers.celery.progress import progress_chunk, waiting_queues, warn_waiting
from bulksync.workers.celery.publish import (
    Batch,
    DirectPublisher,
    Outgoing,
    StepMessages,
    batch_size,
    send,
)

if TYPE_CHECKING:
    from bulksync.workers.celery.executor import CeleryExecutor

# The step's log lines keep the executor's logger, which operators filter on.
log = logging.getLogger("bulksync.workers.celery.executor")

_STOP_POLL = 0.05
"""Seconds between two looks at the claims of a cancelled step's running tasks."""


class CeleryStep:
    """One dispatched step: its Redis keys, its messages and its gatherer."""

    def __init__(
        self,
        executor: CeleryExecutor,
        spec: GraphSpec,
        step: StepInput,
        live: StepLive,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
        run_id: str,
    ) -> None:
        self.ex = executor
        self.spec = spec
        self.step = step
        self.live = live
        self.tasks = {t.id: t for t in tasks}
        self.deliver = deliver
        self.run_id = run_id
        self.thread = str((step.config.get("configurable") or {}).get("thread_id") or "")
        self.key = executor.gatherer.new_key()
        self.last_seen = time.monotonic()  # when the gatherer last heard from the step
        self.pending = set(self.tasks)
        self.slots: dict[str, str] = {}
        self.messages: dict[str, list[str]] = {}  # Celery message id -> task ids
        self._probed: list[str] = []
        self._recorded: tuple[Backlog | None, set[str]] = (None, set())  # at the last probe
        self._surveyed: list[str] = []  # the tasks the pending claim look asks about
        self.deadlines: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self.cancelled: list[str] = []  # the tasks the step's cancel stopped
        self._warned: set[str] = set()  # queues already reported as waiting

    # -- dispatch ---------------------------------------------------------------------

    def start(self, path: tuple[str, ...]) -> None:
        """Store the step, deliver known results, publish the rest, start gathering."""
        timeout = self.ex.default_timeout
        self.addressed = StepMessages(
            self.ex.graph_id, path, self.key, self.run_id, self.thread, timeout
        )
        self.slots = {t: wire.slot(t, self.step) for t in self.tasks}
        self.watch = ClaimWatch(self.ex.settings, self.slots)
        try:
            with collector.paused(len(self.tasks)):
                self._dispatch(list(self.tasks), joining=True)
        except BaseException:
            self.ex.gatherer.remove(self)
            raise

    def _retry(self, call: Callable[[], Any], what: str) -> Any:
        """``call()``, retried while Redis is unreachable (up to ``retry_window`` s)."""
        return retry(
            call,
            transient=is_transient_redis,
            window=self.ex.settings.retry_window,
            what=f"step {self.key}: {what}",
        )

    def _dispatch(self, ids: list[str], *, joining: bool = False) -> None:
        """Store the step for ``ids``, deliver those with a result, publish the others.

        One round trip stores the step, reads which tasks have a result already (a step
        dispatched again after a restart), wakes the gatherer to gather the step when it is
        ``joining``, and, on the direct path (``publish.py``), publishes the messages
        of all ``ids``: a worker reports the result a task has instead of running it again.
        On that path the round trip may be shared with other runs' steps (``outbox.py``).
        Otherwise a fresh step's messages follow through ``send_task``, and only those of
        the tasks without a result.
        """
        r = self.ex.redis
        tasks = [self.tasks[t] for t in ids]
        batches = self._batches(tasks)
        mapping: dict[Any, Any] = {keys.STATE_FIELD: wire.dumps_state(self.step)}
        mapping.update({keys.task_input_field(t.id): wire.dumps_input(t.input, t) for t in tasks})
        mapping.update(self._batch_fields(batches))
        outbox = self._outbox()
        outgoing = self._outgoing(batches) if outbox is not None else []
        flag: int | None = None  # where the reply telling whether the run was cancelled is

        def commands(pipe: Any) -> None:  # a command run twice sets the same value,
            nonlocal flag  # or publishes a copy a worker skips
            start = len(pipe)
            pipe.mget([keys.result(self.slots[t]) for t in ids])
            pipe.hset(keys.step(self.key), mapping=mapping)
            pipe.expire(keys.step(self.key), self.ex.settings.step_ttl)
            if self.run_id:
                pipe.sadd(keys.run_steps(self.run_id), self.key)
                pipe.expire(keys.run_steps(self.run_id), self.ex.settings.run_ttl)
                pipe.exists(keys.cancel(self.run_id))
                flag = len(pipe) - 1 - start
            if joining:  # before the messages go, in the same round trip
                self.ex.gatherer.add(self)

        def store() -> tuple[list[Any], bool]:
            # The checkpoint the step starts from is stored before any of it is sent.
            if outbox is not None:
                replies, joined = outbox.send(commands, outgoing, self.live.starting)
                self._shared(joined)
            else:
                if self.live.starting is not None:
                    self.live.starting()
                pipe = r.pipeline(transaction=False)
                commands(pipe)
                replies = pipe.execute()
            return replies[0], flag is not None and bool(replies[flag])

        results, cancelled = self._retry(store, "store the step")
        known = [res for res in results if res is not None]
        todo = tasks
        if known and outbox is None:  # some finished before: publish the others, batched anew
            finished = {t for t, res in zip(ids, results, strict=True) if res is not None}
            todo = [t for t in tasks if t.id not in finished]
            batches = self._batches(todo)
        for res in known:
            self._deliver(wire.loads_result(res))
        if cancelled:
            self.cancel()
        elif batches:
            if outbox is None:
                fields = self._batch_fields(batches) if known else {}
                self._retry(lambda: self._publish(batches, fields), "publish the step")
            self._log_dispatch(todo, len(batches))

    def _batch_fields(self, batches: list[Batch]) -> dict[Any, Any]:
        """The step-hash fields holding the descriptors of each message of several tasks: a
        message stays small at any width."""
        return {
            keys.batch_field(m): wire.dumps_descs([self._describe(t) for t in c])
            for _, m, c in batches
            if len(c) > 1
        }

    def _log_dispatch(self, todo: list[Task], messages: int) -> None:
        if not log.isEnabledFor(logging.INFO):  # (its node counts and ids cost a wide step)
            return
        nodes: dict[str, int] = defaultdict(int)
        for task in todo:
            nodes[task.name] += 1
        named = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(nodes.items()))
        where = f" of subgraph {'|'.join(self.step.namespace)}" if self.step.namespace else ""
        ids = [t.id for t in todo]
        log.info(
            "run %s thread %s: step %d%s dispatched %d tasks in %d messages (nodes %s; tasks %s)",
            self.run_id or "-",
            self.thread or "-",
            todo[0].step,
            where,
            len(todo),
            messages,
            named,
            " ".join(ids[:8]) + (f" +{len(ids) - 8}" if len(ids) > 8 else ""),
            extra=logs.ids(run_id=self.run_id, thread_id=self.thread, step=todo[0].step),
        )

    def _queue(self, task: Task) -> str:
        """The queue ``task`` is published to: its node's, else the executor's."""
        return self.spec.nodes[task.name].queue or self.ex.settings.queue

    def _describe(self, task: Task) -> wire.TaskDescriptor:
        return wire.TaskDescriptor.of(task, self.slots[task.id])

    def _batches(self, todo: list[Task]) -> list[Batch]:
        """``(node, message id, tasks)`` per message: a node's Send tasks several at a time."""
        by_node: dict[str, list[Task]] = defaultdict(list)
        for task in todo:
            by_node[task.name].append(task)
        out = []
        for node, group in by_node.items():
            is_async = self.spec.nodes[node].is_async
            size = (
                batch_size(len(group), self.ex.settings, is_async=is_async)
                if group[0].is_push
                else 1
            )
            for i in range(0, len(group), size):
                out.append((node, uuid.uuid4().hex, group[i : i + size]))
        return out

    def _outbox(self) -> Outbox | None:
        """The executor's outbox, while messages may skip ``send_task`` (``publish.py``)."""
        outbox = self.ex.outbox
        return outbox if outbox is not None and DirectPublisher.usable() else None

    def _outgoing(self, batches: list[Batch]) -> list[Outgoing]:
        """The messages of ``batches``, each remembered with its tasks."""
        with self._lock:
            self.messages.update({m: [t.id for t in chunk] for _, m, chunk in batches})
        return self.addressed.of(batches, self._describe, self._queue)

    def _shared(self, joined: set[str]) -> None:
        """The messages ``joined`` with other steps' are never revoked: they carry other
        runs' tasks (``outbox.py``). Their tasks stop as any task of a cancelled step
        does, on the worker."""
        if joined:
            with self._lock:
                for message_id in joined:
                    self.messages.pop(message_id, None)

    def _publish(self, batches: list[Batch], fields: dict[Any, Any]) -> None:
        """Store the step-hash ``fields`` (batches' descriptors), then publish ``batches``:
        in one round trip on the direct path, else through ``send_task`` (``publish.py``)."""
        r, outgoing = self.ex.redis, self._outgoing(batches)
        outbox = self._outbox()
        if outbox is not None:

            def commands(pipe: Any) -> None:
                if fields:
                    pipe.hset(keys.step(self.key), mapping=fields)

            self._shared(outbox.send(commands, outgoing)[1])
            return
        if fields:
            r.hset(keys.step(self.key), mapping=fields)
        send(self.ex.app, outgoing)

    # -- gather (called by the executor's gatherer) -----------------------------------------

    def receive(self, entries: Sequence[bytes]) -> None:
        """Handle entries the gatherer took from the inbox, in order."""
        self.last_seen = time.monotonic()
        with collector.paused(len(entries)):
            for entry in entries:
                self._handle(entry)

    def is_open(self) -> bool:
        """Whether some task still owes a result (and the step was not cancelled)."""
        return self._open()

    def wait_hint(self) -> float:
        """Seconds until the next task deadline or claim survey (``idle_wait`` at most)."""
        return min(self._next_deadline_wait(), self.watch.remaining())

    def expire(self) -> None:
        """Deliver the tasks whose deadline passed as timed out."""
        self._expire()

    def ask_claims(self, pipe: Any) -> bool:
        """Queue on ``pipe`` a look at the unfinished tasks' claims, if one is due (False:
        none is)."""
        if not self._open() or not self.watch.due():
            return False
        with self._lock:
            pending = set(self.pending)
        self._surveyed = self.watch.ask(pipe, pending)
        return True

    def probe(self, pipe: Any) -> None:
        """Queue: does the step hash exist, which results are recorded."""
        with self._lock:
            self._probed = sorted(self.pending)
        pipe.exists(keys.step(self.key))
        # MGET needs a key; a step with no pending task is ignored by settle() anyway.
        pipe.mget([keys.result(self.slots[t]) for t in self._probed] or [keys.step(self.key)])

    def settle(self, replies: list[Any], backlog: Backlog) -> None:
        """Dispatch again if the keys are gone; deliver results whose report was lost.

        A result recorded is reported in the same script, so its report (with the custom
        events before it) is in the inbox or was taken. It counts as lost when the inbox was
        empty at this probe, or when it was recorded at the last probe already and the
        gatherer has taken every entry the inbox held then (``Backlog``).
        """
        exists, found = replies
        if not self._open():
            return
        if not exists:
            self._recover()
            return
        recorded = {t: res for t, res in zip(self._probed, found, strict=True) if res is not None}
        (before, earlier), self._recorded = self._recorded, (backlog, set(recorded))
        if not backlog.empty:
            taken_through = before is not None and before.through <= backlog.taken
            recorded = {t: r for t, r in recorded.items() if taken_through and t in earlier}
        stray = [wire.loads_result(res) for res in recorded.values()]
        if stray:
            log.warning(
                "step %s: %d results recorded but not reported to its inbox; delivering them",
                self.key,
                len(stray),
            )
        for result in stray:
            self._deliver(result)

    def forget(self) -> None:
        """The step's results are stored for good (its checkpoint is committed): a restarted
        coordinator will never dispatch it again, so its tasks' results are deleted (by the
        gatherer) rather than kept for ``result_ttl``."""
        if self.slots:
            self.ex.gatherer.forget([keys.result(s) for s in self.slots.values()])

    def drop_keys(self, pipe: Any) -> None:
        """Queue the deletion of the finished step's keys. A stopped step's hash and delivery
        counts went when it stopped: by now a retry of its run may count its own starts
        under the same slots."""
        with self._lock:
            stopped = self._stopped
        if not stopped:
            self._queue_over(pipe)
        if self.run_id:
            pipe.srem(keys.run_steps(self.run_id), self.key)

    def _queue_over(self, pipe: Any) -> None:
        """Queue the deletion of the step's hash, then of its tasks' delivery counts. A copy
        of a message claimed after that finds the step over (``claims.py``), so a poison task
        runs no more, and a retry of the run, which dispatches the step again under the same
        slots, counts its attempts afresh. (A step that ends with every result has no retry
        under its slots: its tasks' results answer one.)"""
        pipe.delete(keys.step(self.key))
        counts = [keys.deliveries(s) for s in self.slots.values()]
        for i in range(0, len(counts), FORGET_BATCH):
            pipe.unlink(*counts[i : i + FORGET_BATCH])

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

    # -- lost workers, lost messages (claims.py) ----------------------------------------

    def heard_claims(self, replies: list[Any]) -> None:
        """Act on the replies to ``ask_claims``: dispatch again the tasks whose worker or
        message was lost, fail those that lost their worker ``max_deliveries`` times."""
        ids, self._surveyed = self._surveyed, []
        found = self.watch.judge(ids, replies)
        self._report(found, len(ids))
        r = self.ex.redis
        for task_id, attempts in found.poisoned.items():
            error = WorkerLostError(self.tasks[task_id].name, task_id, attempts)
            log.error("step %s: %s", self.key, error)
            self._deliver(TaskResult(task_id, error=error))
        if found.lost:
            log.warning(
                "step %s: the workers of %d tasks died (their claims expired); dispatching "
                "them again: %s",
                self.key,
                len(found.lost),
                ", ".join(found.lost),
            )
        if found.republish:
            log.warning(
                "step %s: %d tasks not started after their grace period (a lost message?); "
                "publishing them again: %s",
                self.key,
                len(found.republish),
                ", ".join(found.republish),
            )
        again = [self.tasks[t] for t in [*found.lost, *found.republish]]
        if again:
            self._republish(r, again)

    def _report(self, found: Survey, pending: int) -> None:
        """Stream where the step's tasks are; warn once per queue whose tasks wait too long."""
        step = next(iter(self.tasks.values())).step
        after = self.ex.settings.queue_wait_warning
        waiting = waiting_queues(found, self.tasks, self._queue, after)
        warn_waiting(waiting, self._warned, self.ex.graph_id, self.run_id, self.thread, step)
        chunk = progress_chunk(step, self.tasks, len(self.tasks) - pending, found, waiting)
        self.live.sink(self.step.namespace, "progress", chunk)

    def _republish(self, r: redis.Redis, tasks: list[Task]) -> None:
        """Publish ``tasks`` again; the step hash already holds their inputs."""
        batches = self._batches(tasks)
        if not r.exists(keys.step(self.key)):
            return  # Redis lost the step: the gatherer's recovery dispatches it whole
        self._publish(batches, self._batch_fields(batches))

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
            namespace, mode, chunk = wire.loads_event(data)
            if mode == CALLBACK_EVENTS:  # a task's callback, for the run's handlers
                replay(self.step.config.get("callbacks"), chunk)
            else:
                self.live.sink(namespace, mode, chunk)
        elif kind == wire.CANCEL:
            self._stop()  # the gatherer does not wait: it serves every step
        elif kind in (wire.SAVE, wire.QUERY):  # a graph a task invoked, checkpointing
            try:
                serve(self.live.saver, self.ex.redis, kind, data)
            except Exception:  # the task goes on; its invoked graph's checkpoint is lost
                log.exception("step %s: could not store a checkpoint of an invoked graph", self.key)

    def _deliver(self, result: TaskResult) -> None:
        with self._lock:
            if result.task_id not in self.pending:
                return
            self.pending.discard(result.task_id)
        # A cancelled task was asked for (the run's end says so); a bubble-up is control flow.
        if result.error is not None and not isinstance(
            result.error, GraphBubbleUp | TaskCancelledError
        ):
            self._log_failure(result.task_id, result.error)
        self.deliver(result)

    def _log_failure(self, task_id: str, error: BaseException) -> None:
        task = self.tasks[task_id]
        log.warning(
            "run %s thread %s step %d node %s task %s failed: %s: %s",
            self.run_id or "-",
            self.thread or "-",
            task.step,
            task.name,
            task_id,
            type(error).__name__,
            (str(error).splitlines() or [""])[0],
            extra=logs.ids(
                run_id=self.run_id,
                thread_id=self.thread,
                step=task.step,
                node=task.name,
                task_id=task_id,
            ),
        )

    def _started(self, task_id: str) -> None:
        timeout = self.ex.default_timeout
        if timeout and task_id in self.tasks:
            with self._lock:
                self.deadlines.setdefault(task_id, time.monotonic() + timeout)

    def _next_deadline_wait(self) -> float:
        if not self.deadlines:  # no task time limit, or no task started yet
            return self.ex.settings.idle_wait
        with self._lock:
            live = [self.deadlines[t] for t in self.pending if t in self.deadlines]
        if not live:
            return self.ex.settings.idle_wait
        return max(0.01, min(live) - time.monotonic())

    def _expire(self) -> None:
        if not self.deadlines:  # (looked at by the gatherer's chores, every step each time)
            return
        now = time.monotonic()
        with self._lock:
            late = [t for t in self.pending if self.deadlines.get(t, math.inf) <= now]
        if not late:
            return
        self._revoke(late)
        for task_id in late:
            task = self.tasks[task_id]
            limit = self.ex.default_timeout or 0.0
            self._deliver(
                TaskResult(
                    task_id,
                    error=TaskTimeoutError(
                        f"node '{task.name}': task {task_id} ran longer than the {limit:g}s "
                        "task time limit; raise it with BULKSYNC_TASK_TIMEOUT, or look for a "
                        "hung call in the node."
                    ),
                )
            )

    # -- cancel -----------------------------------------------------------------------

    def cancel(self) -> None:
        """Revoke the unfinished tasks, deliver them as cancelled, and wait (``STOP_WAIT``
        at most) until the async nodes among those already running have stopped, as a step
        run in-process does (a sync node cannot be stopped: it is not waited for)."""
        self._stop()
        nodes = self.spec.nodes
        self._await_stopped([t for t in self.cancelled if nodes[self.tasks[t].name].is_async])

    def _stop(self) -> None:
        """Revoke the unfinished tasks and deliver them as cancelled (once). The step is over
        from now: its hash and delivery counts go first, before the loop can hear of the stop,
        so a run retried at once (after a poison task failed it) counts its attempts afresh."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            left = self.cancelled = sorted(self.pending)
        self._revoke(left, terminate=True)
        wake = self.ex.redis.pipeline(transaction=False)
        self._queue_over(wake)
        # Workers stop the step's tasks already running (``stopper.py``).
        wake.set(keys.step_cancel(self.key), 1, ex=self.ex.settings.step_ttl)
        wire.report(wake, self.key, wire.CANCEL)  # wake the gatherer
        wake.expire(keys.inbox(self.key), self.ex.settings.step_ttl)
        try:
            wake.execute()
        finally:  # whatever Redis says, the loop hears of every task
            for task_id in left:
                self._deliver(TaskResult(task_id, error=TaskCancelledError(task_id)))

    def _await_stopped(self, task_ids: Sequence[str]) -> None:
        """Wait until no worker holds the claim of any of ``task_ids`` (``STOP_WAIT`` at
        most): a worker drops a task's claim once the task has ended."""
        claimed = [keys.claim(self.slots[t]) for t in task_ids if t in self.slots]
        deadline = time.monotonic() + STOP_WAIT
        try:
            while claimed and self.ex.redis.exists(*claimed) and time.monotonic() < deadline:
                time.sleep(_STOP_POLL)
        except redis.RedisError as exc:  # the tasks stop all the same; only the wait is cut
            log.warning("step %s: could not wait for its cancelled tasks: %s", self.key, exc)

    def _revoke(self, task_ids: Sequence[str], *, terminate: bool = False) -> None:
        wanted = set(task_ids)
        with self._lock:
            ids = [m for m, tids in self.messages.items() if wanted.intersection(tids)]
        if ids:
            # terminate: a prefork worker stops the process running the message, freeing its
            # slot (thread pools cannot; their workers skip the run's remaining tasks).
            self.ex.app.control.revoke(ids, terminate=terminate)
