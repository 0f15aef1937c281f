"""The superstep loop: plan, execute, gather, apply, commit — one loop for every executor.

Each step: plan the tasks from the latest checkpoint (``plan``); give back the recorded
writes of tasks that already finished; run the rest on the ``Executor`` (a subgraph node
runs as a nested loop whose tasks go through the same executor); record each result as
pending writes the moment it arrives; then apply all writes in task-path order (``apply``)
and commit the checkpoint before the next step is planned. A crash anywhere re-plans the
same task ids from the last checkpoint and runs only the unfinished tasks again.

The loop keeps the run's live state (channels, versions, the step's tasks); how its input
is taken (or the thread resumed, replayed or forked) is ``first_step.py``'s; what is stored
lives in its ``Ledger`` (``ledger.py``) and what is streamed in its ``StreamBuffer``
(``stream_buffer.py``). Subgraphs run as child loops (``nested.run_child``), from a
subgraph node or from a graph invoked inside a node.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from bulksync import collector
from bulksync.cache.base import FullKey
from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import Checkpoint, CheckpointSaver
from bulksync.constants import (
    ERROR,
    INTERRUPT,
    NO_WRITES,
    NODE_ERROR,
    NS_END,
    NS_SEP,
    RESUME,
    RETURN,
    TASKS,
)
from bulksync.context import NullResume
from bulksync.coordinator import clock, first_step, stream
from bulksync.coordinator.apply import TaskWrites, Versions, apply_writes
from bulksync.coordinator.cached import cache_key, cached_writes, keep_writes
from bulksync.coordinator.executor import (
    Executor,
    Nesting,
    StepHandle,
    StepInput,
    StepLive,
    StreamSink,
    TaskResult,
)
from bulksync.coordinator.inbox import STREAMED, Await, Inbox, Steps, drive
from bulksync.coordinator.ledger import Ledger
from bulksync.coordinator.nested import ReplayState, start_subgraph_task
from bulksync.coordinator.options import RunOptions
from bulksync.coordinator.plan import Task, prepare_next_tasks, should_interrupt
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.coordinator.status import read_task_statuses
from bulksync.coordinator.stream_buffer import StreamBuffer
from bulksync.errors import (
    GraphDrained,
    GraphInterrupt,
    GraphRecursionError,
    ParentCommand,
    TaskCancelledError,
    is_invalid_resume,
)
from bulksync.managed import managed_values
from bulksync.types import Interrupt


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: its output values and the interrupts it is waiting on."""

    output: Any
    interrupts: tuple[Interrupt, ...]
    status: str


@dataclasses.dataclass(slots=True)
class _Gathering:
    """One step's results as they arrive (``SuperstepLoop.run_tasks``)."""

    answer: Any
    """The run-wide resume answer the step's tasks share, until one reports it took it."""
    several: bool
    """More than one task: each result is streamed as it is recorded."""
    failure: BaseException | None = None
    """The first error that stops the step."""
    paused: bool = False
    """A task was interrupted: the run pauses once the step's results are in."""


class SuperstepLoop:
    """Drives one graph (or one subgraph call) from its input to the end or a pause."""

    def __init__(
        self,
        spec: GraphSpec,
        input: Any,
        *,
        saver: CheckpointSaver | None,
        executor: Executor,
        options: RunOptions,
        sink: StreamSink,
        checkpoint_ns: str = "",
        nesting: Nesting | None = None,
        null_resume: NullResume | None = None,
        namespace: tuple[str, ...] | None = None,
        replay: ReplayState | None = None,
        store: Any = None,
        control: Any = None,
        abandoned: threading.Event | None = None,
        home: Any = None,
        cache: Any = None,
    ) -> None:
        self.spec = spec
        self.cache = spec.cache if spec.cache is not None else cache
        self.home = home  # the async caller's event loop (StepLive.home); a child's is its root's
        self.store = spec.store if spec.store is not None else store
        self.control = options.control if options.control is not None else control
        # Set when nobody reads the run any more (a stream broken off): stop, cancel what
        # has not started. A child loop shares its root's.
        self.abandoned = abandoned if abandoned is not None else threading.Event()
        self.stopped = False  # this loop's caller stopped it (its parent goes on)
        self.blocking = False  # driven by ``run`` on a thread it blocks (not by a reactor)
        self.read_here = False  # driven by its stream's reader (``inbox.Reading``)
        # ... whose chunks go to its caller's code between steps (``stream``, not ``invoke``)
        self.read_by_caller = True
        self.cache_keys: dict[str, FullKey] = {}  # this step's tasks' node cache entries
        self._handle: StepHandle | None = None
        self.input = input
        self.saver = saver
        self.executor = executor
        self.options = options
        self.sink = sink
        self.checkpoint_ns = checkpoint_ns
        self.nesting = nesting
        if namespace is None:
            namespace = tuple(checkpoint_ns.split(NS_SEP)) if checkpoint_ns else ()
        self.stream = StreamBuffer(sink, namespace, spec, options)
        self.replay = replay
        self.origin = first_step.find_origin(saver, options, checkpoint_ns, nesting, replay)
        self.ledger = Ledger(
            saver,
            options,
            self.origin.saved,
            checkpoint_ns=checkpoint_ns,
            parents=nesting.checkpoint_map if nesting else {},
        )
        checkpoint = self.ledger.checkpoint
        self.versions = Versions.of(checkpoint)
        self.channels: dict[str, BaseChannel[Any, Any]] = {
            k: tmpl.from_checkpoint(checkpoint.channel_values.get(k, MISSING))
            for k, tmpl in spec.channels.items()
        }
        self.step = int(self.ledger.metadata.get("step", -2)) + 1
        self.stop = self.step + options.recursion_limit + 1
        self.updated_channels: set[str] | None = (
            set(checkpoint.updated_channels) if checkpoint.updated_channels is not None else None
        )
        self.status = "input"
        self.is_resuming = False
        self.is_replaying = False
        self.resume_map: Mapping[str, Any] | None = None
        # A nested loop's run-wide resume answer falls back to its parent task's.
        self.null_resume = NullResume(None, null_resume)
        self.tasks: dict[str, Task] = {}
        self.task_writes: dict[str, list[Write]] = {}
        self.interrupts: list[Interrupt] = []

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint the loop stands on."""
        return self.ledger.checkpoint

    # -- planning and committing ------------------------------------------------------

    def _current(self) -> Checkpoint:
        """The checkpoint with the versions as they are now (input writes applied)."""
        return dataclasses.replace(
            self.checkpoint,
            channel_versions=self.versions.channel_versions,
            versions_seen=self.versions.versions_seen,
        )

    def plan(self) -> dict[str, Task]:
        """The tasks of the current step, from the live versions."""
        sends = self.channels.get(TASKS)
        wide = len(sends.get()) if sends is not None and sends.is_available() else 0
        with collector.paused(wide):
            return prepare_next_tasks(
                self.spec,
                self._current(),
                self.channels,
                self.step,
                self.checkpoint_ns,
                self.updated_channels,
                managed_values(self.spec.managed, self.step, self.stop),
            )

    def commit(self, source: str, *, defer: bool = False, soon: bool = False) -> None:
        """Commit the step's checkpoint and move on to the next step (``defer``, ``soon``:
        see ``Ledger.commit``)."""
        self.ledger.commit(
            source,
            self.channels,
            self.versions,
            self.step,
            self.updated_channels,
            defer=defer,
            soon=soon,
        )
        self.step += 1

    # -- one step ---------------------------------------------------------------------

    def _unless_abandoned(self) -> None:
        if self.abandoned.is_set() or self.stopped:
            raise TaskCancelledError(
                "run abandoned: its caller stopped reading the stream; it stops before "
                f"step {self.step}, its checkpoint saved"
            )

    def tick(self) -> bool:
        """Plan the next step; False when the run is over (done, or out of steps)."""
        self._unless_abandoned()
        if self.step > self.stop:
            self.status = "out_of_steps"
            self._stream_checkpoint(self.plan())  # the last one saved, as a step would
            return False
        self.tasks = self.plan()
        self.task_writes = {}
        ledger = self.ledger
        self._stream_checkpoint(self.tasks)
        if not self.tasks:
            self.status = "done"
            return False
        if not self.is_replaying and ledger.pending:
            statuses = read_task_statuses(w for w in ledger.pending if w[0] in self.tasks)
            for tid, status in statuses.items():
                if status.finished:
                    self.task_writes[tid] = list(status.output)
        before = self.options.interrupt_before
        if before and should_interrupt(self._current(), before, self.tasks.values()):
            self.status = "interrupt_before"
            raise GraphInterrupt()
        # A drain stops before the step's tasks run; after the breakpoint check, which a
        # resume passes (a drain in front of a breakpoint would skip it).
        if self.control is not None and self.control.drain_requested:
            self.status = "draining"
            self.stream.flush()
            raise GraphDrained(self.control.drain_reason or "shutdown")
        for task in self.tasks.values():
            self.stream.task_start(task)
        for tid, writes in self.task_writes.items():
            self.stream.update(self.tasks[tid], writes, cached=True)
        return True

    def run_tasks(self) -> Steps[None]:
        """Run the step's unfinished tasks, recording each result as it arrives; yields
        where it waits for them (``inbox.py``)."""
        self._handle = None
        self.stream.flush()
        if self.read_here:  # its reader takes the step's chunks before its tasks start
            if self.read_by_caller:  # whose code may reach the saver: its commit is done
                self.ledger.confirm()
            yield STREAMED
            self._unless_abandoned()
        todo = self._from_cache([t for t in self.tasks.values() if t.id not in self.task_writes])
        if not todo:
            return
        # User code starts from a stored checkpoint only: an executor that says so stores it
        # itself (``StepLive.starting``), once the step is ready to go; else it is stored now.
        gates = getattr(self.executor, "calls_starting", False)
        if any(not self.spec.nodes[t.name].bookkeeping for t in todo) and not (
            gates and all(self.spec.nodes[t.name].subgraph is None for t in todo)
        ):
            self.ledger.store_deferred()
        results = Inbox()
        # The step's tasks share one copy of the run-wide answer (a worker gets its own); the
        # run's answer is consumed when a task reports it took its copy (``_take``).
        step = _Gathering(answer=self.null_resume.peek(), several=len(todo) > 1)
        self._start_tasks(todo, step.answer, results.put)
        # A commit confirmed late holds back every other commit of the saver's, so none is
        # left unconfirmed across a yield: a reactor's threads may all be waiting on it.
        self.ledger.confirm()
        deadline = clock.deadline(self.options.step_timeout)
        left = len(todo)
        while left:
            ready = yield Await(results, left, clock.earliest(deadline, self.ledger.store_by))
            if not ready and not clock.passed(deadline):
                self.ledger.flush()  # the results' writes kept back are due
                continue
            if not ready:
                self._timed_out()
            left -= len(ready)
            self._take(ready, step, last=not left)
        if step.failure is not None:
            self.stream.flush()  # the failed task's result is streamed before the error
            raise step.failure
        if step.paused:
            raise GraphInterrupt(tuple(self.interrupts))

    def _start_tasks(
        self, todo: list[Task], answer: Any, deliver: Callable[[TaskResult], None]
    ) -> None:
        """Submit ``todo``'s tasks to the executor (its handle kept as the step's) and start
        its subgraph nodes' tasks, each result to ``deliver``."""
        plain = [t for t in todo if self.spec.nodes[t.name].subgraph is None]
        step_input = self._step_input()
        live = StepLive(
            self.sink,
            NullResume(answer),
            self.executor,
            self.saver,
            self.replay,
            self.store,
            self.control,
            self.abandoned,
            self.cache,
            self.home,
            lone=self.blocking and len(todo) == 1 and self.options.step_timeout is None,
            starting=self.ledger.store_deferred,
        )
        handle = self._handle = (
            self.executor.submit(self.spec, step_input, live, plain, deliver) if plain else None
        )
        if handle is not None and (self.abandoned.is_set() or self.stopped):
            handle.cancel()  # abandoned while it was being submitted
        for task in todo:
            if self.spec.nodes[task.name].subgraph is not None:
                start_subgraph_task(self.spec, self.executor, task, step_input, live, deliver)

    def _timed_out(self) -> NoReturn:
        """The step outran its ``step_timeout``: cancel its unfinished tasks and fail."""
        if self._handle is not None:
            self._handle.cancel()
        self.stream.flush()
        raise TimeoutError(
            f"A step of graph '{self.spec.name}' ran longer than its step_timeout "
            f"of {self.options.step_timeout}s; its unfinished tasks were cancelled."
        ) from None

    def _take(self, ready: list[TaskResult], step: _Gathering, *, last: bool) -> None:
        """Record the results that arrived; the first error cancels the step's other tasks.
        With the ``last`` of them in, the step's writes are held for its checkpoint."""
        with self.ledger.batched(), collector.paused(len(ready)):
            for result in ready:
                step.paused = step.paused or result.interrupted
                if result.took_null_resume and step.answer is not None:
                    self.null_resume.take()
                    step.answer = None
                if step.failure is not None and isinstance(result.error, TaskCancelledError):
                    continue  # stopped because of the failure: it never ran, nothing to record
                error = self._record(self.tasks[result.task_id], result)
                if error is None and step.failure is None and step.several:
                    self.stream.flush()
                if error is not None and step.failure is None:
                    step.failure = error
                    # An answer that failed its response_schema leaves the interrupt open;
                    # the other answered tasks finish (stopped after a side effect, they
                    # would redo it).
                    if self._handle is not None and not is_invalid_resume(error):
                        self._handle.cancel()
            if last and step.failure is None and not step.paused:
                self.ledger.hold()  # the step is done: stored with its checkpoint

    def _from_cache(self, todo: list[Task]) -> list[Task]:
        """Record the tasks whose writes the node cache holds (``cached.py``); the others,
        to run (their cache keys kept, for their results)."""
        self.cache_keys = {}
        if self.cache is None:
            return todo
        for task in todo:
            node = self.spec.nodes[task.name]
            if node.cache_policy is not None:
                self.cache_keys[task.id] = cache_key(node.cache_ns, node.cache_policy, task.input)
        found = cached_writes(self.cache, self.cache_keys)
        for task in todo:
            if task.id in found:
                self._record(task, TaskResult(task.id, tuple(found[task.id])), cached=True)
        return [t for t in todo if t.id not in found]

    def _step_input(self) -> StepInput:
        resume = {
            tid: list(s.resume)
            for tid, s in read_task_statuses(self.ledger.pending).items()
            if s.resume
        }
        versions = self.versions.channel_versions
        values = {k: c.checkpoint() for k, c in self.channels.items()}
        parents = dict(self.nesting.checkpoint_map) if self.nesting else {}
        parents[self.checkpoint_ns] = self.checkpoint.id
        return StepInput(
            # Not the pending Sends: each task has its own as its input, no node reads the
            # rest, and a wide fan-out's list is the largest value of its step.
            channel_values={
                k: self.ledger.with_bytes(k, v, versions.get(k))
                for k, v in values.items()
                if v is not MISSING and k != TASKS
            },
            config=self.options.config,
            stop=self.stop,
            resume=resume,
            resume_map=self.resume_map,
            null_resume=self.null_resume.peek(),
            namespace=self.stream.namespace,
            nesting=Nesting(
                recursion_limit=self.options.recursion_limit,
                durability=self.options.durability,
                modes=tuple(sorted(self.options.modes)),
                resuming=self.is_resuming,
                checkpoint_map=parents,
                subgraphs=self.options.subgraphs,
            ),
            context=self.options.context,
            returns={tid: v for tid, chan, v in self.ledger.pending if chan == RETURN},
            node_errors={tid: v for tid, chan, v in self.ledger.pending if chan == NODE_ERROR},
            checkpointed=self.saver is not None,
        )

    def _record(self, task: Task, result: TaskResult, cached: bool = False) -> BaseException | None:
        """Persist one task's result (``cached``: writes the node cache held); return the
        error that must stop the step, if any."""
        for call in result.calls:  # ``@task`` calls it made: their results outlive a pause
            self.ledger.record(call.task_id, call.path, call.writes, call.name)
        path = stream.task_path_key(task)
        if result.error is not None:
            if isinstance(result.error, ParentCommand | GraphDrained):
                return result.error  # control flow: nothing of the task's to record
            # A node failure its crashed handler left is kept: a resumed run retries the handler.
            failed = [(ERROR, result.error), *result.writes]
            self.ledger.record(task.id, path, failed, task.name)
            self.stream.result(task, [(ERROR, result.error)])
            return result.error
        if result.interrupted:
            writes: list[Write] = [(INTERRUPT, list(result.interrupts)), *result.writes]
            plain = self.ledger.record(task.id, path, writes, task.name)
            self.interrupts.extend(result.interrupts)
            if result.interrupts:  # a bare pause is streamed once, when the run stops
                self.stream.interrupts(self.channels, result.interrupts)
            self.stream.result(task, plain)
            return None
        writes = list(result.writes)
        if all(chan == RESUME for chan, _ in writes):  # finished with nothing to write
            writes.append((NO_WRITES, None))
        plain = self.ledger.record(task.id, path, writes, task.name)
        self.task_writes[task.id] = [w for w in plain if w[0] not in (RESUME,)]
        shown = dataclasses.replace(task, name=result.handled_by) if result.handled_by else task
        self.stream.update(shown, self.task_writes[task.id], cached=cached)
        key = self.cache_keys.get(task.id)
        if key is not None and not cached and not result.handled_by:
            ttl = self.spec.nodes[task.name].cache_policy.ttl  # type: ignore[union-attr]
            keep_writes(self.cache, key, self.task_writes[task.id], ttl)
        self.stream.result(task, plain)
        return None

    def after_tick(self) -> None:
        """Apply the step's writes in task-path order and commit the checkpoint."""
        with collector.paused(len(self.tasks)):
            done = [
                TaskWrites(t.name, t.path, self.task_writes.get(t.id, ()), t.triggers)
                for t in self.tasks.values()
            ]
            self.updated_channels = apply_writes(
                self.versions,
                self.channels,
                done,
                self.spec.trigger_to_nodes,
                version_bits=clock.version_bits(),
            )
        all_writes = [w for t in done for w in t.writes]
        keys = self.stream.keys
        if stream.wrote_any(all_writes, keys) or self.updated_channels & set(
            [keys] if isinstance(keys, str) else keys
        ):
            self.stream.values(self.channels)
        self.ledger.pending.clear()
        self.is_replaying = False
        # The loop plans its next step while Postgres commits this one.
        self.commit("loop", soon=True)
        self._forget_step()
        after = self.options.interrupt_after
        if after and should_interrupt(self.checkpoint, after, self.tasks.values()):
            self.status = "interrupt_after"
            self._stream_checkpoint(self.plan())  # the one the run pauses on
            raise GraphInterrupt()
        # Only the first step resumes: a subgraph a later step enters again starts on its
        # new input, as LangGraph unsets its resuming flag here.
        self.is_resuming = False

    def _forget_step(self) -> None:
        """The step's checkpoint is committed, or nothing could run it again (a root graph
        without a saver): what its executor kept to recover the step can go. Not under
        ``durability="exit"``, nor in a subgraph that stores no checkpoints of its own: a
        restart runs those steps again, and finds their tasks' results."""
        forget = getattr(self._handle, "forget", None)
        if forget is None:
            return
        if self.ledger.durable:
            self.ledger.when_stored(forget)
        elif self.saver is None and self.nesting is None:
            forget()

    def halt(self) -> None:
        """This loop's caller stopped (a node invoking it was cancelled): as ``abandon``,
        for this loop alone (``abandoned`` may be its parent's)."""
        self.stopped = True
        handle = self._handle
        if handle is not None:
            handle.cancel()

    def abandon(self) -> None:
        """The caller stopped reading: stop before the next step, cancel the step's tasks
        that have not started (on a cluster: revoke them); running ones finish."""
        self.abandoned.set()
        handle = self._handle
        if handle is not None:
            handle.cancel()

    def _stream_checkpoint(self, tasks: Mapping[str, Task]) -> None:
        """Stream the current checkpoint with the tasks planned from it."""
        if self.saver is None:  # as LangGraph: no checkpoints to show without a saver
            return
        ledger = self.ledger
        if self.stream.wants("checkpoints"):
            ledger.confirm()  # a checkpoint streamed can be read back, as before
        self.stream.checkpoint(
            ledger.config,
            ledger.parent_config,
            self.channels,
            ledger.metadata,
            list(tasks.values()),
            ledger.pending.rows,
            step=self.step - 1,
        )

    # -- the whole run ----------------------------------------------------------------

    def run(self) -> Outcome:
        """Run to the end or a pause on this thread (``steps``, driven by blocking)."""
        self.blocking = True
        return drive(self.steps())

    def steps(self) -> Steps[Outcome]:
        """Run to the end or a pause; interrupts of a root graph end the run normally.

        A generator: it yields what it waits for and is sent the results that arrived, so
        that either a blocking driver or the reactor can move it on (``inbox.py``).

        Raises:
            GraphRecursionError: more steps than ``recursion_limit``.
            GraphInterrupt: a nested loop paused (its parent task records the interrupts).
        """
        try:
            first_step.start(self)
            while self.tick():
                yield from self.run_tasks()
                self.after_tick()
        except GraphInterrupt as exc:
            self._exit(failed=True)
            if self.nesting is not None:
                self.stream.flush()
                raise
            outcome = self._interrupted(exc)
            self.stream.flush()
            return outcome
        except BaseException:
            self._exit(failed=True)
            raise
        self._exit(failed=False)
        self.stream.flush()
        if self.status == "out_of_steps":
            raise GraphRecursionError(
                f"Recursion limit of {self.options.recursion_limit} reached without hitting a "
                "stop condition. Raise the limit with config={'recursion_limit': N}, or check "
                "that the graph has an edge to END."
            )
        return Outcome(stream.read_channels(self.channels, self.stream.keys), (), self.status)

    def _exit(self, *, failed: bool) -> None:
        """Store the writes held for a checkpoint the run did not make; under
        ``durability="exit"``, store the final checkpoint and writes now."""
        self.ledger.flush()
        if self.saver is None or self.options.durability != "exit":
            return
        if self.nesting is not None and not failed and NS_END in self.checkpoint_ns:
            return
        self.ledger.commit("exit", self.channels, self.versions, self.step, self.updated_channels)
        self.ledger.store_at_exit(
            {tid: stream.task_path_key(task) for tid, task in self.tasks.items()}
        )

    def _interrupted(self, exc: GraphInterrupt) -> Outcome:
        keys = self.stream.keys
        # Tasks that finished before the pause: show the state with their writes applied.
        if self.ledger.pending and self.task_writes:
            done = [
                TaskWrites(t.name, t.path, self.task_writes[t.id], t.triggers)
                for t in self.tasks.values()
                if t.id in self.task_writes
            ]
            scratch = {k: c.copy() for k, c in self.channels.items()}
            changed = apply_writes(
                Versions.of(self.checkpoint),
                scratch,
                done,
                self.spec.trigger_to_nodes,
                version_bits=clock.version_bits(),
            )
            if changed & ({keys} if isinstance(keys, str) else set(keys)):
                self.stream.emit("values", stream.read_channels(scratch, keys))
        if not exc.interrupts:
            self.stream.paused(())
        self.status = self.status if self.status.startswith("interrupt") else "interrupted"
        return Outcome(
            stream.read_channels(self.channels, keys), tuple(self.interrupts), self.status
        )
