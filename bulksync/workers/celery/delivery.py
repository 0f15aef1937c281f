"""One delivery of a node-task message on a worker: its tasks claimed, run and recorded.

A task runs only under its claim (``claims.py``), and its result is recorded with the script
that also drops the claim (``recorder.py``). The tasks of one message run at once when they
wait (model and tool calls):

- async ones are claimed together in the round trip that reads the step, and all run on the
  process's event loop, no thread waiting for any of them; results that finish together are
  recorded together;
- sync ones run one by one while they are quick. Without a time limit they are all claimed
  in the round trip that reads the step, their claims held from then on: the first counted
  as started, the others only reserved, each counted as it starts by a write nobody waits
  for (``starts.py``). A quick task costs no round trip of its own. Once one of them took
  ``parallel_after`` while its thread mostly waited, the rest run at once on the process's
  task threads, each claim held until a thread takes its task up. With a time limit, each
  is claimed as it starts, the first with the step's read, each result recorded in the
  round trip that claims the next task (the coordinator's clock for a task starts with its
  claim), and the rest, once one waited, are claimed as threads take them up. Tasks that
  compute run one by one whatever they take: threads of one process would only share its
  GIL. A process remembers the nodes whose last task it ran waited (``WorkerRuntime.
  learn``): a message of such a node runs all its tasks at once from the first, rather than
  the first alone until it shows it waits, which doubled the message's time (a model call
  after a model call); the node's next quick or computing task makes it one by one again.

  The results of tasks quicker than ``QUICK_TASK`` wait for a few more (``HELD_RESULTS`` at
  most), then are recorded by one script: they reach the coordinator's inbox together, and
  it takes them in one call instead of one each — most of what it spent on a fan-out of
  trivial tasks. A held result waits at most for the next task of its message to run. None
  is held when the tasks have a time limit (the coordinator would count the wait against
  it), and an error is never held (it stops the step).

Tasks not started when the run was cancelled are not run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Final

import redis

from bulksync import keys
from bulksync.coordinator.executor import StepLive, TaskResult
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import TaskTimeoutError, WorkerLostError
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.cancel_scope import CancelScope, within
from bulksync.workers.celery import claims
from bulksync.workers.celery.claims import Held
from bulksync.workers.celery.recorder import Record
from bulksync.workers.remote import RemoteStep

if TYPE_CHECKING:
    from bulksync.workers.celery.node_task import WorkerRuntime

log = logging.getLogger(__name__)

WAITING: Final = 0.25
"""A slow sync task whose thread computed for at most this share of its time waited (a model
or tool call): the other tasks of its message run at once."""

CANCELLED: Final = object()
"""A task its run's cancel, or its step's end, kept from starting (the rest of its message is
not run)."""
SKIPPED: Final = object()
"""A task this delivery may not run (another runs it, or it has a result): not counted."""

QUICK_TASK: Final = 0.002
"""A sync task that took less (seconds) is quick: its result may wait for the next ones."""
HELD_RESULTS: Final = 16
"""Results of quick tasks held back at most, recorded then in one script."""

Todo = tuple[wire.TaskDescriptor, bytes | None]
"""A task to run: its descriptor and its encoded input."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ran:
    """A sync task run under its claim: its error (or None); how long it took and the CPU
    time its thread spent on it; its result, to record (which drops the claim)."""

    answer: BaseException | None
    took: float
    cpu: float
    record: Record


def first_claims(
    descs: Sequence[wire.TaskDescriptor],
    spec: GraphSpec,
    settings: Settings,
    timeout: float | None,
) -> tuple[Sequence[wire.TaskDescriptor], int]:
    """The tasks of a message a delivery claims first, all at once, in the round trip that
    reads the step (``Delivery(claimed=...)``), and how many of the first of them start at
    once (their claims count their starts; the others are reserved, each counted as it
    starts): every async task when they run at once; every sync task without a time limit,
    the first starting at once; else the first task."""
    if not descs:
        return [], 0
    if spec.nodes[descs[0].node].is_async and settings.task_threads > 1:
        return descs, len(descs)
    if spec.nodes[descs[0].node].is_async or timeout:
        return descs[:1], 1
    return descs, 1


def release_unused(keeper: claims.ClaimKeeper, claimed: dict[str, Any]) -> None:
    """Drop the claims taken in advance for tasks this delivery did not run."""
    taken = [slot for slot, reply in claimed.items() if int(reply) > 0]
    keeper.release(*(Held(keys.claim(slot), keeper.token) for slot in taken))
    claimed.clear()


class Delivery:
    """The tasks of one message of step ``step_key`` (of run ``run_id``) on this worker."""

    def __init__(
        self,
        runtime: WorkerRuntime,
        step_key: str,
        run_id: str,
        timeout: float | None,
        step: RemoteStep,
        live: StepLive,
        claimed: dict[str, Any] | None = None,
        reserved: Collection[str] = (),
        task_name: str = "",
    ) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.step_key = step_key
        self.run_id = run_id
        self.timeout = timeout
        self.step = step
        self.live = live
        self.keeper = runtime.claims()
        self.recorder = runtime.recorder()
        self.starts = runtime.starts()
        self._claimed = dict(claimed or {})  # slot -> the reply to its claim, asked already
        self._reserved = frozenset(reserved)  # of those, the slots whose starts are not counted
        self._scope: CancelScope | None = None  # the delivery's, while it runs (``run``)
        self.task_name = task_name  # the node's (``registry.task_name``): what a process learns

    def run(self, todo: list[Todo], is_async: bool) -> list[tuple[Todo, Any]]:
        """``(task, answer)`` for ``todo``, in their order: the task's error (or None), or
        ``SKIPPED``; tasks the run's cancel kept from starting are left out.

        The tasks share one cancel scope, watched while the delivery lasts: they belong to
        one step of one run, so the flags that stop one stop them all (as the tasks of a
        step in-process share one, ``local.py``).
        """
        try:
            with self.runtime.stopper().running(self.step_key, self.run_id) as scope:
                self._scope = scope
                return self._run_async(todo) if is_async else self._run_sync(todo)
        finally:
            release_unused(self.keeper, self._claimed)

    def _within(self) -> contextlib.AbstractContextManager[None]:
        """Run a task of this delivery under its cancel scope."""
        assert self._scope is not None, "a delivery's tasks run inside Delivery.run"
        return within(self._scope)

    # -- claims ---------------------------------------------------------------------------

    def verdicts(
        self, descs: Sequence[wire.TaskDescriptor], after: Sequence[Record] = ()
    ) -> list[Any]:
        """For each of ``descs``, in one round trip: None when this delivery claimed it (and
        runs it), else why not. The results ``after`` (of the tasks just run) are recorded
        first in the same round trip."""
        slots = [d.slot for d in descs]
        if after:
            pipe = self.runtime.redis().pipeline(transaction=False)
            recording = self.recorder.queue(pipe, after)
            self.keeper.ask(pipe, slots, self.run_id, self.step_key)
            try:
                replies = pipe.execute()
            except redis.RedisError:
                self.recorder.write(after)  # through an outage; the claims fail
                raise
            self.recorder.written(after, replies[:recording])
            asked = self.keeper.answers(replies[recording:])
            found = self.keeper.verdicts(slots, self.run_id, self.step_key, asked)
        elif all(slot in self._claimed for slot in slots):  # asked with the step's read
            replies = [self._claimed.pop(slot) for slot in slots]
            found = self.keeper.verdicts(
                slots, self.run_id, self.step_key, replies, reserved=self._reserved
            )
        else:
            found = self.keeper.claim_many(slots, self.run_id, self.step_key)
        answers: list[Any] = []
        for desc, claimed in zip(descs, found, strict=True):
            if claimed == claims.CANCELLED:
                answers.append(CANCELLED)
            elif claimed <= 0:
                self._unclaimed(desc, claimed)
                answers.append(SKIPPED)
            else:
                answers.append(None)
        if self.timeout:  # the coordinator's clock for these tasks starts now
            self._report_started([d.id for d, a in zip(descs, answers, strict=True) if a is None])
        return answers

    def _unclaimed(self, desc: wire.TaskDescriptor, verdict: int) -> None:
        """A task this delivery may not run: report what is known of it, or nothing."""
        if verdict == claims.KNOWN:  # finished since the message was read
            result = self.runtime.redis().get(keys.result(desc.slot))
            if isinstance(result, bytes):
                self.recorder.write([Record(self.step_key, desc.slot, result)])
        elif verdict == claims.POISONED:
            error = WorkerLostError(desc.node, desc.id, self.settings.max_deliveries)
            log.error("%s", error)
            data = wire.dumps_result(TaskResult(desc.id, error=error), desc.node)
            self.recorder.write([Record(self.step_key, desc.slot, data, keep=False)])
        # HELD: a live worker runs it; its result reaches the step, or the coordinator
        # notices the claim expire and dispatches the task again.

    def _report_started(self, task_ids: list[str]) -> None:
        """Tell the coordinator the clocks of ``task_ids`` start now."""
        if not task_ids:
            return
        key, r = self.step_key, self.runtime.redis()
        entries = [wire.STARTED + t.encode() for t in task_ids]
        self.runtime.retry(lambda: wire.report(r, key, *entries), "reporting starts")

    def _let_go(self, records: Sequence[Record]) -> None:
        """Stop renewing the claims of recorded results (the record dropped them)."""
        self.keeper.drop(*(rec.claim for rec in records if rec.claim is not None))

    # -- sync tasks -----------------------------------------------------------------------

    def _run_sync(self, todo: list[Todo]) -> list[tuple[Todo, Any]]:
        if todo and not self.timeout and all(desc.slot in self._claimed for desc, _ in todo):
            return self._run_reserved(todo)
        done: list[tuple[Todo, Any]] = []
        rest: list[Todo] = list(todo) if self._all_at_once(todo) else []
        finished: list[Record] = []  # results not recorded yet: with the next claim
        last: Ran | None = None
        try:
            for i, task in enumerate([] if rest else todo):
                recorded: list[Record] = []
                if not self._may_hold(finished, last):
                    recorded, finished = finished, []
                try:
                    (refused,) = self.verdicts([task[0]], recorded)
                finally:
                    self._let_go(recorded)
                if refused is CANCELLED:
                    return done
                if refused is not None:
                    done.append((task, refused))
                    continue
                ran = last = self._run_claimed(*task)
                done.append((task, ran.answer))
                finished.append(ran.record)
                if self._learn(ran):  # a model or tool call: the others run at once
                    rest = todo[i + 1 :]
                    break
        finally:
            if finished:
                self.recorder.write(finished)
                self._let_go(finished)
        for task, answer in self._run_at_once(rest):
            if answer is not CANCELLED:
                done.append((task, answer))
        return done

    def _run_reserved(self, todo: list[Todo]) -> list[tuple[Todo, Any]]:
        """Run sync tasks claimed or reserved with the step's read (no time limit): one by
        one while they are quick, each reserved one counted as it starts, the results of
        quick ones recorded a few at a time; once one waited, the rest at once."""
        answers = self.verdicts([desc for desc, _ in todo])  # the read's replies: no round trip
        claims = {
            desc.slot: self.keeper.hold(desc.slot)
            for (desc, _), answer in zip(todo, answers, strict=True)
            if answer is None
        }
        done: list[tuple[Todo, Any]] = []
        items = list(zip(todo, answers, strict=True))
        # After a task that waited (or when the node's tasks wait): they run at once.
        later: list[tuple[Todo, Any]] = items if self._all_at_once(todo) else []
        finished: list[Record] = []  # results not recorded yet
        try:
            for i, (task, answer) in enumerate([] if later else items):
                if answer is CANCELLED or (answer is None and self._cancelled()):
                    return done
                if answer is not None:
                    done.append((task, answer))
                    continue
                self._count([task[0].slot])
                ran = self._run_claimed(*task, claims.pop(task[0].slot))
                done.append((task, ran.answer))
                finished.append(ran.record)
                if not self._may_hold(finished, ran):
                    recorded, finished = finished, []
                    if self._record(recorded):
                        return done
                if self._learn(ran):  # a model or tool call: the others run at once
                    later = items[i + 1 :]
                    break
            recorded, finished = finished, []
            if self._record(recorded):
                return done
            rest = [task for task, answer in later if answer is None]
            at_once = self._run_at_once(rest, [claims.pop(t[0].slot) for t in rest])
            by_slot = {task[0].slot: answer for task, answer in at_once}
            for task, answer in later:
                answer = by_slot[task[0].slot] if answer is None else answer
                if answer is not CANCELLED:
                    done.append((task, answer))
        finally:
            self._record(finished)
            self.keeper.drop(*claims.values())  # reserved, never started
        return done

    def _count(self, slots: list[str]) -> None:
        """Count the starts of ``slots`` that the claims that took them did not count."""
        self.starts.count([slot for slot in slots if slot in self._reserved])

    def _cancelled(self) -> bool:
        """Whether this delivery's step or run was cancelled (as its scope last saw)."""
        return self._scope is not None and self._scope.cancelled

    def _record(self, records: list[Record]) -> bool:
        """Record ``records`` now, dropping their claims; whether the step or the run was
        cancelled, as Redis says in the same round trip (no task of it may start then)."""
        if not records:
            return False
        pipe = self.runtime.redis().pipeline(transaction=False)
        recording = self.recorder.queue(pipe, records)
        pipe.exists(keys.cancel(self.run_id), keys.step_cancel(self.step_key))
        try:
            try:
                replies = pipe.execute()
            except redis.RedisError:
                self.recorder.write(records)  # through an outage; the stopper watches the flags
                return False
            self.recorder.written(records, replies[:recording])
            return bool(replies[recording])
        finally:
            self._let_go(records)

    def _run_at_once(
        self, rest: list[Todo], held: list[Held] | None = None
    ) -> list[tuple[Todo, Any]]:
        """Run ``rest`` on the process's task threads; ``(task, answer)`` for each, in order.

        Without a time limit they are claimed in one round trip — or were reserved already,
        their claims ``held``, and are counted now — and each claim is held until a thread
        takes its task up (a claim per task cost a round trip and a thread switch each, and
        held the starts of a wide fan-out back). With one, each is claimed as a thread takes
        it up: the coordinator's clock of a task starts with its claim.
        """
        if not rest:
            return []
        pool = self.runtime.task_pool()
        if held is not None:
            try:
                self._count([desc.slot for desc, _ in rest])
            except BaseException:
                self.keeper.drop(*held)
                raise
            running = [pool.submit(self._run_one, t, c) for t, c in zip(rest, held, strict=True)]
        elif self.timeout:
            running = [pool.submit(self._run_one, task) for task in rest]
        else:
            refusals = self.verdicts([desc for desc, _ in rest]) if rest else []
            running = [
                pool.submit(self._run_one, task, self.keeper.hold(task[0].slot))
                if refused is None
                else _settled(refused)
                for task, refused in zip(rest, refusals, strict=True)
            ]
        return [(task, future.result()) for task, future in zip(rest, running, strict=True)]

    def _may_hold(self, finished: Sequence[Record], last: Ran | None) -> bool:
        """Whether the results ``finished`` (``last`` ran the newest) may stay unrecorded
        through the next claim: the module's docstring says when."""
        return (
            last is not None
            and last.answer is None
            and last.took < QUICK_TASK
            and len(finished) < HELD_RESULTS
            and not self.timeout
        )

    def _run_one(self, task: Todo, claim: Held | None = None) -> Any:
        """Run one task on a task thread, claimed here unless ``claim`` holds it already
        (then a cancel of its step or run since keeps it from starting, as a claim would);
        its result is recorded with those of the message's other tasks that finish
        meanwhile."""
        if claim is None:
            (refused,) = self.verdicts([task[0]])
            if refused is not None:
                return refused
        elif self._scope is not None and self._scope.cancelled:
            self.keeper.drop(claim)
            return CANCELLED
        ran = self._run_claimed(*task, claim)
        self._learn(ran)
        try:
            self.recorder.commit(ran.record)
        finally:
            self._let_go([ran.record])
        return ran.answer

    def _run_claimed(
        self, desc: wire.TaskDescriptor, data: bytes | None, claim: Held | None = None
    ) -> Ran:
        """Run a task this delivery claimed, keeping its claim alive meanwhile (``claim``:
        held since it was claimed)."""
        claim = claim or self.keeper.hold(desc.slot)
        try:
            with self._within():  # (on a task thread too)
                began, cpu = time.monotonic(), time.thread_time()
                outcome = self.step.run(desc, data, self.live)
                took, cpu = time.monotonic() - began, time.thread_time() - cpu
        except BaseException:
            self.keeper.drop(claim)
            raise
        rec = Record(self.step_key, desc.slot, outcome.data, outcome.keep, claim)
        return Ran(outcome.error or self._overtime(desc, took), took, cpu, rec)

    def _waits(self, ran: Ran) -> bool:
        """Whether a sync task was slow while its thread mostly waited."""
        slow = ran.took >= self.settings.parallel_after
        return self.settings.task_threads > 1 and slow and ran.cpu <= ran.took * WAITING

    def _learn(self, ran: Ran) -> bool:
        """Whether a sync task waited (``_waits``), noted by the process for the node's next
        messages."""
        waited = self._waits(ran)
        self.runtime.learn(self.task_name, waited=waited)
        return waited

    def _all_at_once(self, todo: list[Todo]) -> bool:
        """Whether ``todo`` (several) run at once from the first: the node's last task
        here waited."""
        threads = self.settings.task_threads > 1
        return threads and len(todo) > 1 and self.runtime.waits(self.task_name)

    # -- async tasks ----------------------------------------------------------------------

    def _run_async(self, todo: list[Todo]) -> list[tuple[Todo, Any]]:
        async def one_by_one() -> list[Any]:  # task_threads 1: nothing at once
            answers = []
            for desc, data in todo:
                (refused,) = await asyncio.to_thread(self.verdicts, [desc])
                answers.append(refused)
                if refused is None:
                    answers[-1] = await self._arun_claimed(desc, data, self.keeper.hold(desc.slot))
                elif refused is CANCELLED:
                    break
            return answers

        async def at_once() -> list[Any]:
            answers = await asyncio.to_thread(self.verdicts, [desc for desc, _ in todo])
            claimed = [i for i, answer in enumerate(answers) if answer is None]
            ran = [self._arun_claimed(*todo[i], self.keeper.hold(todo[i][0].slot)) for i in claimed]
            for i, answer in zip(claimed, await asyncio.gather(*ran), strict=True):
                answers[i] = answer
            return answers

        run = one_by_one() if self.settings.task_threads <= 1 else at_once()
        answers = asyncio.run_coroutine_threadsafe(run, self.runtime.event_loop()).result()
        return [(t, a) for t, a in zip(todo, answers, strict=False) if a is not CANCELLED]

    async def _arun_claimed(
        self, desc: wire.TaskDescriptor, data: bytes | None, claim: Held
    ) -> Any:
        """Run one claimed task of an async node on this process's event loop; its error
        (or None). Its result is recorded with those of the tasks that finish meanwhile, on
        a thread: the loop never waits on Redis."""
        try:
            with self._within():  # (in this task's own context)
                began = time.monotonic()
                outcome = await self.step.arun(desc, data, self.live)
                took = time.monotonic() - began
            await self.recorder.record(
                Record(self.step_key, desc.slot, outcome.data, outcome.keep, claim)
            )
        finally:
            self.keeper.unhold(claim)
            if not claim.released:  # (releasing the claim is a Redis call)
                await asyncio.to_thread(self.keeper.release, claim)
        return outcome.error or self._overtime(desc, took)

    def _overtime(self, desc: wire.TaskDescriptor, took: float) -> Exception | None:
        """The timeout error of a task that finished after its limit (the coordinator has
        delivered ``TaskTimeoutError`` for it by then, and ignores its late result)."""
        if not self.timeout or took <= self.timeout:
            return None
        return TaskTimeoutError(
            f"node '{desc.node}': task {desc.id} ran {took:.1f}s, past the "
            f"{self.timeout:g}s task time limit"
        )


def _settled(answer: Any) -> concurrent.futures.Future[Any]:
    """A future already holding ``answer``."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_result(answer)
    return future
