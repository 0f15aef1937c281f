"""Running a node task on a remote worker, whatever carried it there: bytes in, bytes out.

A cluster executor stores a step's input once (``wire.dumps_state``) and ships each task as a
descriptor plus its encoded input; the worker side — a Celery task today, a Ray actor
tomorrow — hands those bytes here with the graph spec it loaded and a sink for the task's
stream events, and gets back the encoded result to record. Transport concerns (where the
bytes are read from, how a result is recorded once, caching) stay with the caller.

``RemoteStep`` decodes a step's input once for all the tasks a process runs of it (the
caller may cache it per step); ``run_encoded`` does the whole round for one task.
"""

from __future__ import annotations

import dataclasses
import functools

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.context import NullResume
from bulksync.coordinator.executor import StepInput, StepLive, StreamSink, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import GraphBubbleUp
from bulksync.workers import wire
from bulksync.workers.callback_relay import CALLBACK_EVENTS, relay_manager
from bulksync.workers.execute import arun_task, run_task
from bulksync.workers.local import LocalExecutor


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedResult:
    """A task's encoded result, and whether it is kept (an error is reported, not kept: a
    retry of the run must run the task again)."""

    data: bytes
    keep: bool
    error: BaseException | None = None
    """The error the result carries (the node's, or an unencodable value's), for the
    transport to report as a failed task; ``None`` for writes and for interrupts."""


class RemoteStep:
    """One step as a worker sees it: its input decoded once from the coordinator's bytes."""

    def __init__(self, spec: GraphSpec, data: bytes) -> None:
        self.spec = spec
        self.input: StepInput = wire.loads_state(data)

    def live(self, sink: StreamSink, saver: CheckpointSaver | None = None) -> StepLive:
        """What the tasks of one delivery share that cannot travel.

        A graph invoked inside a node runs on this worker's threads and streams to ``sink``;
        it checkpoints through ``saver`` (the transport's link to the coordinator's saver)
        when the run has one.
        """
        return StepLive(
            sink,
            NullResume(self.input.null_resume),
            LocalExecutor(),
            saver if self.input.checkpointed else None,
            store=self.spec.store,
            cache=self.spec.cache,
        )

    def run(
        self, desc: wire.TaskDescriptor, task_input: bytes | None, live: StepLive
    ) -> EncodedResult:
        """Run the task ``desc`` names on its encoded input; its encoded result (a failure
        naming the task when its input cannot be read here: ``_unreadable``)."""
        try:
            task, step = self._task(desc, task_input, live)
        except Exception as exc:
            return _unreadable(desc, exc)
        return _encoded(run_task(self.spec, task, step, live), task.name)

    async def arun(
        self, desc: wire.TaskDescriptor, task_input: bytes | None, live: StepLive
    ) -> EncodedResult:
        """``run`` on an event loop (``execute.arun_task``): for async nodes."""
        try:
            task, step = self._task(desc, task_input, live)
        except Exception as exc:
            return _unreadable(desc, exc)
        return _encoded(await arun_task(self.spec, task, step, live), task.name)

    def _task(
        self, desc: wire.TaskDescriptor, task_input: bytes | None, live: StepLive
    ) -> tuple[Task, StepInput]:
        """The task ``desc`` names, and the step input it runs with."""
        task = desc.task(wire.loads_input(task_input))
        step = self.input
        if step.trace is not None:  # the run's callbacks: relayed to where its handlers are
            emit = functools.partial(live.sink, step.namespace, CALLBACK_EVENTS)
            config = {**step.config, "callbacks": relay_manager(step.trace, emit)}
            step = dataclasses.replace(step, config=config)
        return task, step


def _unreadable(desc: wire.TaskDescriptor, error: Exception) -> EncodedResult:
    """The result of a task whose input this process cannot read (a type whose module it
    has not imported, bytes of a newer writer): the task fails at once with ``error``,
    named as a node's failure is, instead of its worker being taken for lost and the task
    delivered again until its deliveries run out."""
    error.add_note(f"During task with name '{desc.node}' and id '{desc.id}'")
    return _encoded(TaskResult(desc.id, error=error), desc.node)


def _encoded(outcome: TaskResult, node: str) -> EncodedResult:
    data, error = wire.encode_result(outcome, node)
    if isinstance(error, GraphBubbleUp):  # a parent command: control flow, not a failure
        return EncodedResult(data, False)
    return EncodedResult(data, error is None, error)


def run_encoded(
    spec: GraphSpec,
    step: bytes,
    desc: bytes,
    task_input: bytes | None,
    sink: StreamSink,
) -> bytes:
    """Run one task from its bytes (step input, descriptor, task input); its encoded result.

    ``task_input`` is ``None`` for a task with nothing to read.
    """
    remote = RemoteStep(spec, step)
    return remote.run(wire.loads_descriptor(desc), task_input, remote.live(sink)).data
