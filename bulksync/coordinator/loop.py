"""The superstep loop: plan, execute, gather, apply, commit — one loop for every executor.

Each step: plan the tasks from the latest checkpoint (``plan``); give back the recorded
writes of tasks that already finished; run the rest on the ``Executor`` (a subgraph node
runs as a nested loop whose tasks go through the same executor); record each result as
pending writes the moment it arrives; then apply all writes in task-path order (``apply``)
and commit the checkpoint before the next step is planned. A crash anywhere re-plans the
same task ids from the last checkpoint and runs only the unfinished tasks again.
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Mapping, Sequence
from typing import Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointSaver,
    PendingWrite,
    config_thread,
)
from bulksync.checkpoint.serde import dumps_for
from bulksync.constants import (
    CHECKPOINT_ID,
    CHECKPOINT_NS,
    ERROR,
    INTERRUPT,
    NO_WRITES,
    NS_END,
    NULL_TASK_ID,
    RESUME,
    THREAD_ID,
)
from bulksync.context import NullResume
from bulksync.coordinator import stream
from bulksync.coordinator.apply import (
    TaskWrites,
    Versions,
    apply_writes,
    create_checkpoint,
    empty_checkpoint,
    new_versions,
)
from bulksync.coordinator.commands import command_writes, is_resume_map
from bulksync.coordinator.executor import Executor, StepInput, StreamSink, TaskResult
from bulksync.coordinator.nested import NestedInfo, start_subgraph_task
from bulksync.coordinator.options import RunOptions, checkpoint_metadata
from bulksync.coordinator.plan import Task, prepare_next_tasks, should_interrupt
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.coordinator.status import pending_interrupt_ids, read_task_statuses
from bulksync.errors import (
    EmptyInputError,
    GraphInterrupt,
    GraphRecursionError,
    ParentCommand,
    SerializationError,
    TaskCancelledError,
)
from bulksync.types import Command, Interrupt

_SPECIAL = (ERROR, INTERRUPT, RESUME)
"""Pending-write channels whose rows replace a task's earlier rows rather than add to them."""


@dataclasses.dataclass(frozen=True, slots=True)
class Nesting:
    """How a nested loop sits under the task that runs it."""

    resuming: bool
    null_resume: NullResume
    checkpoint_map: Mapping[str, str]


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: its output values and the interrupts it is waiting on."""

    output: Any
    interrupts: tuple[Interrupt, ...]
    status: str


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
    ) -> None:
        self.spec = spec
        self.input = input
        self.saver = saver
        self.executor = executor
        self.options = options
        self.sink = sink
        self.checkpoint_ns = checkpoint_ns
        self.namespace: tuple[str, ...] = tuple(checkpoint_ns.split("|")) if checkpoint_ns else ()
        self.nesting = nesting
        self.status = "input"
        self.interrupts: list[Interrupt] = []
        self.resume_map: Mapping[str, Any] | None = None
        self.null_resume = NullResume(None, nesting.null_resume if nesting else None)
        # Chunks wait here until a point where LangGraph's stream would hand them out, so
        # a step that fails drops the same chunks it does.
        self._buffer: list[tuple[str, Any]] = []
        self._load()

    @property
    def pending_writes(self) -> list[PendingWrite]:
        """Writes recorded against the current checkpoint, as ``(task id, channel, value)``."""
        return self._pending_writes

    @pending_writes.setter
    def pending_writes(self, writes: list[PendingWrite]) -> None:
        self._pending_writes = writes
        self._special_tasks = {w[0] for w in writes if w[1] in _SPECIAL}

    # -- loading and the first step ---------------------------------------------------

    def _load(self) -> None:
        conf = dict(self.options.config.get("configurable") or {})
        self.thread_id = conf.get(THREAD_ID)
        self.addressed = bool(conf.get(CHECKPOINT_ID)) and self.nesting is None
        # An addressed checkpoint the thread has moved past: its finished tasks run again.
        self.superseded = False
        saved = None
        if self.saver is not None:
            config_thread(self.options.config)  # a saver needs a thread id
            lookup = {**conf, CHECKPOINT_NS: self.checkpoint_ns}
            if self.nesting is not None:
                lookup.pop(CHECKPOINT_ID, None)
            saved = self.saver.get_tuple({"configurable": lookup})
            if self.addressed and saved is not None:
                head_conf = {k: v for k, v in lookup.items() if k != CHECKPOINT_ID}
                head = self.saver.get_tuple({"configurable": head_conf})
                self.superseded = head is not None and head.checkpoint.id != saved.checkpoint.id
        self.checkpoint_config: dict[str, Any] = {
            "configurable": {THREAD_ID: self.thread_id, CHECKPOINT_NS: self.checkpoint_ns}
        }
        if saved is not None:
            self.checkpoint: Checkpoint = saved.checkpoint
            self.metadata: dict[str, Any] = dict(saved.metadata)
            self.pending_writes = list(saved.pending_writes)
            self.checkpoint_config = saved.config
            self.parent_config: dict[str, Any] | None = saved.parent_config
        else:
            self.checkpoint = empty_checkpoint()
            self.metadata = {"step": -2}
            self.pending_writes = []
            self.parent_config = None
        self.saved_versions = dict(self.checkpoint.channel_versions)
        self.versions = Versions.of(self.checkpoint)
        self.channels: dict[str, BaseChannel[Any, Any]] = {
            k: tmpl.from_checkpoint(self.checkpoint.channel_values.get(k, MISSING))
            for k, tmpl in self.spec.channels.items()
        }
        self.step = int(self.metadata.get("step", -2)) + 1
        self.stop = self.step + self.options.recursion_limit + 1
        self.updated_channels: set[str] | None = (
            set(self.checkpoint.updated_channels)
            if self.checkpoint.updated_channels is not None
            else None
        )
        self.tasks: dict[str, Task] = {}
        self.task_writes: dict[str, list[Write]] = {}

    def _first(self) -> None:
        is_command = isinstance(self.input, Command)
        has_state = bool(self.versions.channel_versions)
        if self.nesting is not None:
            self.is_resuming = has_state and self.nesting.resuming
        else:
            self.is_resuming = has_state and (self.input is None or is_command)
        resuming_cmd = is_command and self.input.resume is not None
        time_travel = self.addressed and not resuming_cmd
        self.is_replaying = time_travel or self.superseded
        if time_travel:
            self.pending_writes = [w for w in self.pending_writes if w[1] != RESUME]
        forks = (
            self.is_resuming
            and time_travel
            and (self.metadata.get("source") not in ("update", "fork") or self.superseded)
        )
        carried: list[PendingWrite] = []
        if is_command:
            writes = self._command_input(self.input)
            if forks:
                carried = [(NULL_TASK_ID, c, v) for c, v in writes]
            elif writes:
                self._put_writes(NULL_TASK_ID, "", writes)
        null_writes = [(c, v) for t, c, v in (*self.pending_writes, *carried) if t == NULL_TASK_ID]
        for chan, value in null_writes:
            if chan == RESUME and value is not None:
                self.null_resume = NullResume(value, self.null_resume)
        if null_writes:
            changed = apply_writes(
                self.versions,
                self.channels,
                [TaskWrites("__input__", (), null_writes)],
                self.spec.trigger_to_nodes,
            )
            if self.updated_channels is not None:
                self.updated_channels |= changed
        if self.is_resuming:
            self.versions.versions_seen[INTERRUPT] = dict(self.versions.channel_versions)
            if forks:
                self.pending_writes = [w for w in self.pending_writes if w[1] != INTERRUPT]
                self._put_checkpoint("fork")
            self._emit_values()
        elif self.input is not None and not is_command:
            self._apply_input(self.input)
        elif not (self.nesting is not None and self.nesting.resuming):
            raise EmptyInputError(
                f"Received no input for {self.spec.input_channels}: pass an input, or resume "
                "an existing thread (its config must name a thread with a checkpoint)."
            )

    def _command_input(self, cmd: Command[Any]) -> list[Write]:
        if cmd.resume is not None:
            if self.saver is None:
                raise RuntimeError(
                    "Cannot use Command(resume=...) without checkpointer: compile the graph "
                    "with checkpointer=... and pass a thread_id."
                )
            if is_resume_map(cmd.resume):
                self.resume_map = dict(cmd.resume)
            elif len(pending_interrupt_ids(self.pending_writes)) > 1:
                raise RuntimeError(
                    "When there are multiple pending interrupts, you must specify the "
                    "interrupt id when resuming: Command(resume={interrupt.id: value, ...})."
                )
        writes = command_writes(cmd, self.spec, resume_is_map=self.resume_map is not None)
        if not writes and self.resume_map is None:
            raise EmptyInputError("Received empty Command input: set update, goto or resume.")
        return writes

    def _current(self) -> Checkpoint:
        """The checkpoint with the versions as they are now (input writes applied)."""
        return dataclasses.replace(
            self.checkpoint,
            channel_versions=self.versions.channel_versions,
            versions_seen=self.versions.versions_seen,
        )

    def _plan(self) -> dict[str, Task]:
        """The tasks of the current step, from the live versions."""
        return prepare_next_tasks(
            self.spec,
            self._current(),
            self.channels,
            self.step,
            self.checkpoint_ns,
            self.updated_channels,
        )

    def _apply_input(self, value: Any) -> None:
        discard = self._plan()
        self.updated_channels = apply_writes(
            self.versions,
            self.channels,
            [
                *(TaskWrites(t.name, t.path, (), t.triggers) for t in discard.values()),
                TaskWrites("__input__", (), [(self.spec.input_channels, value)]),
            ],
            self.spec.trigger_to_nodes,
        )
        self._put_checkpoint("input")

    # -- persistence ----------------------------------------------------------------

    def _put_checkpoint(self, source: str) -> None:
        exiting = source == "exit"
        if not exiting:
            self.metadata = checkpoint_metadata(
                self.options.config,
                source,
                self.step,
                dict(self.nesting.checkpoint_map) if self.nesting else {},
            )
        durable = self.saver is not None and (exiting or self.options.durability != "exit")
        self.checkpoint = create_checkpoint(
            self.checkpoint,
            self.channels,
            self.versions,
            self.step,
            self.updated_channels,
            id=self.checkpoint.id if exiting else None,
        )
        if durable and self.saver is not None:
            changed = new_versions(self.saved_versions, self.checkpoint.channel_versions)
            self.saved_versions = dict(self.checkpoint.channel_versions)
            self.parent_config = (
                self.checkpoint_config
                if self.checkpoint_config["configurable"].get(CHECKPOINT_ID)
                else None
            )
            self.checkpoint_config = self.saver.put(
                self.checkpoint_config, self.checkpoint, self.metadata, changed
            )
        elif not exiting:
            self.parent_config = self.checkpoint_config
            self.checkpoint_config = {
                "configurable": {
                    **self.checkpoint_config["configurable"],
                    CHECKPOINT_ID: self.checkpoint.id,
                }
            }
        if not exiting:
            self.step += 1

    def _put_writes(self, task_id: str, task_path: str, writes: Sequence[Write]) -> None:
        # A task's error/interrupt/resume rows are replaced, not added to. Only a task known
        # to have such rows is filtered, so recording a step stays linear in its fan-out.
        if task_id in self._special_tasks:
            self.pending_writes = [
                w for w in self.pending_writes if not (w[0] == task_id and w[1] in _SPECIAL)
            ]
        if any(c in _SPECIAL for c, _ in writes):
            self._special_tasks.add(task_id)
        self.pending_writes.extend((task_id, c, v) for c, v in writes)
        if self.saver is None or self.options.durability == "exit":
            return
        if not self.checkpoint_config["configurable"].get(CHECKPOINT_ID):
            # A Command input on a thread with no checkpoint yet: nothing to record the
            # writes against, so they stay in memory, as without a saver.
            return
        try:
            self.saver.put_writes(self.checkpoint_config, writes, task_id, task_path)
        except SerializationError as exc:
            task = self.tasks.get(task_id)
            node = task.name if task else "input"
            for chan, value in writes:  # raises naming the first channel that cannot be stored
                dumps_for(self.saver.serde, value, node=node, channel=chan)
            raise SerializationError(f"node '{node}': {exc}") from exc

    # -- one step ---------------------------------------------------------------------

    def tick(self) -> bool:
        """Plan the next step; False when the run is over (done, or out of steps)."""
        if self.step > self.stop:
            self.status = "out_of_steps"
            return False
        self.tasks = self._plan()
        self.task_writes = {}
        self._emit_checkpoint()
        if not self.tasks:
            self.status = "done"
            return False
        if not self.is_replaying and self.pending_writes:
            statuses = read_task_statuses(w for w in self.pending_writes if w[0] in self.tasks)
            for tid, status in statuses.items():
                if status.finished:
                    self.task_writes[tid] = list(status.output)
        before = self.options.interrupt_before
        if before and should_interrupt(self._current(), before, self.tasks.values()):
            self.status = "interrupt_before"
            raise GraphInterrupt()
        for task in self.tasks.values():
            if not stream.is_hidden(task):
                self._emit("tasks", stream.task_start(task, self.options.user_metadata))
        for tid, writes in self.task_writes.items():
            self._emit_update(self.tasks[tid], writes, cached=True)
        return True

    def run_tasks(self) -> None:
        """Run the step's unfinished tasks, recording each result as it arrives."""
        self._flush()
        todo = [t for t in self.tasks.values() if t.id not in self.task_writes]
        if not todo:
            return
        results: queue.Queue[TaskResult] = queue.Queue()
        plain = [t for t in todo if self.spec.nodes[t.name].subgraph is None]
        step_input = self._step_input()
        handle = self.executor.submit(self.spec, step_input, plain, results.put) if plain else None
        for task in todo:
            if self.spec.nodes[task.name].subgraph is not None:
                start_subgraph_task(self, task, step_input, results.put)
        failure: BaseException | None = None
        for _ in todo:
            result = results.get()
            if failure is not None and isinstance(result.error, TaskCancelledError):
                continue  # stopped because of the failure: it never ran, nothing to record
            error = self._record(self.tasks[result.task_id], result)
            if error is None and failure is None and len(todo) > 1:
                self._flush()
            if error is not None and failure is None:
                failure = error
                if handle is not None:
                    handle.cancel()
        if failure is not None:
            self._flush()  # the failed task's result is streamed before the error
            raise failure
        if self.interrupts:
            raise GraphInterrupt(tuple(self.interrupts))

    def _step_input(self) -> StepInput:
        resume = {
            tid: list(s.resume)
            for tid, s in read_task_statuses(self.pending_writes).items()
            if s.resume
        }
        values = {k: c.checkpoint() for k, c in self.channels.items()}
        return StepInput(
            channel_values={k: v for k, v in values.items() if v is not MISSING},
            config=self.options.config,
            stop=self.stop,
            resume=resume,
            resume_map=self.resume_map,
            null_resume=self.null_resume,
            sink=self.sink,
            namespace=self.namespace,
            nested=NestedInfo.of(self),
        )

    def _record(self, task: Task, result: TaskResult) -> BaseException | None:
        """Persist one task's result; return the error that must stop the step, if any."""
        path = stream.task_path_key(task)
        if result.error is not None:
            if isinstance(result.error, ParentCommand):
                return result.error
            self._put_writes(task.id, path, [(ERROR, result.error)])
            self._emit_result(task, [(ERROR, result.error)])
            return result.error
        if result.interrupts:
            writes: list[Write] = [(INTERRUPT, list(result.interrupts)), *result.writes]
            self._put_writes(task.id, path, writes)
            self.interrupts.extend(result.interrupts)
            self._emit_interrupts(result.interrupts)
            self._emit_result(task, writes)
            return None
        writes = list(result.writes) or [(NO_WRITES, None)]
        self._put_writes(task.id, path, writes)
        self.task_writes[task.id] = [w for w in writes if w[0] not in (RESUME,)]
        self._emit_update(task, self.task_writes[task.id], cached=False)
        self._emit_result(task, writes)
        return None

    def _emit_result(self, task: Task, writes: Sequence[Write]) -> None:
        if not stream.is_hidden(task):
            self._emit("tasks", stream.task_result(task, writes, self._keys))

    def after_tick(self) -> None:
        """Apply the step's writes in task-path order and commit the checkpoint."""
        done = [
            TaskWrites(t.name, t.path, self.task_writes.get(t.id, ()), t.triggers)
            for t in self.tasks.values()
        ]
        self.updated_channels = apply_writes(
            self.versions, self.channels, done, self.spec.trigger_to_nodes
        )
        all_writes = [w for t in done for w in t.writes]
        if stream.wrote_any(all_writes, self._keys) or self.updated_channels & set(
            [self._keys] if isinstance(self._keys, str) else self._keys
        ):
            self._emit_values()
        self.pending_writes = []
        self.is_replaying = False
        self._put_checkpoint("loop")
        after = self.options.interrupt_after
        if after and should_interrupt(self.checkpoint, after, self.tasks.values()):
            self.status = "interrupt_after"
            raise GraphInterrupt()

    # -- the whole run ----------------------------------------------------------------

    def run(self) -> Outcome:
        """Run to the end or a pause; interrupts of a root graph end the run normally.

        Raises:
            GraphRecursionError: more steps than ``recursion_limit``.
            GraphInterrupt: a nested loop paused (its parent task records the interrupts).
        """
        try:
            self._first()
            while self.tick():
                self.run_tasks()
                self.after_tick()
        except GraphInterrupt as exc:
            self._exit(failed=True)
            if self.nesting is not None:
                self._flush()
                raise
            outcome = self._interrupted(exc)
            self._flush()
            return outcome
        except BaseException:
            self._exit(failed=True)
            raise
        self._exit(failed=False)
        self._flush()
        if self.status == "out_of_steps":
            raise GraphRecursionError(
                f"Recursion limit of {self.options.recursion_limit} reached without hitting a "
                "stop condition. Raise the limit with config={'recursion_limit': N}, or check "
                "that the graph has an edge to END."
            )
        return Outcome(stream.read_channels(self.channels, self._keys), (), self.status)

    def _exit(self, *, failed: bool) -> None:
        """Under ``durability="exit"``, store the final checkpoint and writes now."""
        if self.saver is None or self.options.durability != "exit":
            return
        if self.nesting is not None and not failed and NS_END in self.checkpoint_ns:
            return
        self._put_checkpoint("exit")
        by_task: dict[str, list[Write]] = {}
        for tid, chan, value in self.pending_writes:
            by_task.setdefault(tid, []).append((chan, value))
        for tid, writes in by_task.items():
            task = self.tasks.get(tid)
            path = stream.task_path_key(task) if task else ""
            self.saver.put_writes(self.checkpoint_config, writes, tid, path)

    def _interrupted(self, exc: GraphInterrupt) -> Outcome:
        # Tasks that finished before the pause: show the state with their writes applied.
        if self.pending_writes and self.task_writes:
            done = [
                TaskWrites(t.name, t.path, self.task_writes[t.id], t.triggers)
                for t in self.tasks.values()
                if t.id in self.task_writes
            ]
            scratch = {k: c.copy() for k, c in self.channels.items()}
            changed = apply_writes(
                Versions.of(self.checkpoint), scratch, done, self.spec.trigger_to_nodes
            )
            keys = {self._keys} if isinstance(self._keys, str) else set(self._keys)
            if changed & keys:
                self._emit("values", stream.read_channels(scratch, self._keys))
        if not exc.interrupts:
            self._emit("updates", {INTERRUPT: ()})
        self.status = self.status if self.status.startswith("interrupt") else "interrupted"
        return Outcome(
            stream.read_channels(self.channels, self._keys), tuple(self.interrupts), self.status
        )

    # -- streaming --------------------------------------------------------------------

    @property
    def _keys(self) -> Sequence[str] | str:
        return self.options.output_keys or self.spec.stream_channels

    def _emit(self, mode: str, chunk: Any) -> None:
        if mode in self.options.modes:
            self._buffer.append((mode, chunk))
        if "debug" in self.options.modes and mode in ("tasks", "checkpoints"):
            step = self.step - 1 if mode == "checkpoints" else self.step
            self._buffer.append(("debug", stream.debug_event(mode, step, chunk)))

    def _flush(self) -> None:
        buffered, self._buffer = self._buffer, []
        for mode, chunk in buffered:
            self.sink(self.namespace, mode, chunk)

    def _emit_values(self) -> None:
        self._emit("values", stream.read_channels(self.channels, self._keys))

    def _emit_update(self, task: Task, writes: Sequence[Write], *, cached: bool) -> None:
        if not stream.is_hidden(task):
            self._emit("updates", stream.update_chunk(task, writes, self._keys, cached=cached))

    def _emit_interrupts(self, interrupts: Sequence[Interrupt]) -> None:
        self._emit("updates", {INTERRUPT: tuple(interrupts)})
        if "values" in self.options.modes:
            values = stream.read_channels(self.channels, self._keys)
            if isinstance(values, dict):
                values[INTERRUPT] = tuple(interrupts)
                self._emit("values", values)
            else:
                self._emit("values", {INTERRUPT: tuple(interrupts)})

    def _emit_checkpoint(self) -> None:
        if "checkpoints" not in self.options.modes and "debug" not in self.options.modes:
            return
        payload = stream.checkpoint_payload(
            self.checkpoint_config,
            self.parent_config,
            stream.read_channels(self.channels, self.spec.stream_channels),
            self.metadata,
            list(self.tasks.values()),
            self.pending_writes,
            self._keys,
        )
        self._emit("checkpoints", payload)
