"""Running one node task: the same code in a thread of this process or on a cluster worker.

``run_task`` rebuilds what the node may read (the step's channels), runs the node with its
retry policy inside a ``TaskContext`` (so ``interrupt``, ``get_config`` and
``get_stream_writer`` work), turns its output into writes with the node's writer, and
returns a ``TaskResult``. It never raises: errors and interrupts are part of the result.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.constants import CHECKPOINT_NS, NS_SEP, RESUME
from bulksync.context import Scratchpad, TaskContext, task_context
from bulksync.coordinator.executor import StepInput, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec, NodeSpec, Write
from bulksync.errors import GraphInterrupt, ParentCommand
from bulksync.ids import interrupt_id
from bulksync.types import Command


class StateReader:
    """Reads the step's channels with a task's writes applied to a private copy."""

    def __init__(self, spec: GraphSpec, step: StepInput) -> None:
        self._spec = spec
        self._values = step.channel_values

    def _channel(self, key: str) -> BaseChannel[Any, Any]:
        return self._spec.channels[key].from_checkpoint(self._values.get(key, MISSING))

    def __call__(self, select: Sequence[str] | str, writes: Sequence[Write]) -> Any:
        keys = [select] if isinstance(select, str) else list(select)
        pending: dict[str, list[Any]] = defaultdict(list)
        for chan, value in writes:
            if chan in keys:
                pending[chan].append(value)
        values: dict[str, Any] = {}
        for key in keys:
            if key not in self._spec.channels:
                continue
            channel = self._channel(key)
            if pending.get(key):
                channel.update(pending[key])
            if channel.is_available():
                values[key] = channel.get()
        if isinstance(select, str):
            return values.get(select)
        return values


def task_config(step: StepInput, task: Task) -> dict[str, Any]:
    """The config a node sees: the run's, with the task's namespace and metadata."""
    config = dict(step.config)
    config["metadata"] = {**(step.config.get("metadata") or {}), **task.metadata()}
    config["configurable"] = {
        **(step.config.get("configurable") or {}),
        CHECKPOINT_NS: task.checkpoint_ns,
    }
    return config


def resume_answers(task: Task, step: StepInput) -> list[Any]:
    """Answers the task already has, plus the one a resume map gives its next interrupt."""
    answers = list(step.resume.get(task.id, ()))
    if step.resume_map:
        next_id = interrupt_id(task.checkpoint_ns, len(answers))
        first_id = interrupt_id(task.checkpoint_ns, 0)
        if next_id in step.resume_map:
            answers.append(step.resume_map[next_id])
        elif first_id in step.resume_map:
            answers.append(step.resume_map[first_id])
    return answers


def call_node(node: NodeSpec, value: Any) -> Any:
    """Run the node's function; a coroutine is run to completion on a private event loop."""
    assert node.run is not None, f"node '{node.name}' is a subgraph; the loop runs it"
    result = node.run(value)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def parent_namespace(task_ns: str) -> str:
    """The namespace of the task that runs the graph this task belongs to."""
    parts = task_ns.split(NS_SEP)
    if parts[-1].isdigit():
        parts.pop()
    return NS_SEP.join(parts[:-1])


def apply_parent_command(
    node: NodeSpec, task: Task, exc: ParentCommand, read: StateReader
) -> list[Write]:
    """Writes of a ``Command`` a subgraph sent to this task, or re-raise it further up."""
    cmd = exc.command
    if cmd.graph in (task.checkpoint_ns, task.name):
        local = Command(update=cmd.update, goto=cmd.goto, resume=cmd.resume)
        return node.writer(local, read)
    if cmd.graph == Command.PARENT:
        retarget = Command(
            graph=parent_namespace(task.checkpoint_ns),
            update=cmd.update,
            goto=cmd.goto,
            resume=cmd.resume,
        )
        raise ParentCommand(retarget) from None
    raise exc


def _attempt(node: NodeSpec, task: Task, ctx: TaskContext, read: StateReader) -> list[Write]:
    with task_context(ctx):
        try:
            output = call_node(node, task.input)
            return node.writer(output, read)
        except ParentCommand as exc:
            return apply_parent_command(node, task, exc, read)


def run_task(spec: GraphSpec, task: Task, step: StepInput) -> TaskResult:
    """Run ``task`` of ``spec`` to a result (writes, error or interrupts); never raises."""
    node = spec.nodes[task.name]
    read = StateReader(spec, step)
    attempt = 0
    while True:
        attempt += 1
        resumes: list[Write] = []
        pad = Scratchpad(
            task_ns=task.checkpoint_ns,
            step=task.step,
            stop=step.stop,
            resume=resume_answers(task, step),
            null_resume=step.null_resume,
        )
        ctx = TaskContext(
            config=task_config(step, task),
            scratchpad=pad,
            stream_writer=lambda chunk: step.sink(step.namespace, "custom", chunk),
            send=resumes.extend,
            parent=(step.nested, task) if step.nested is not None else None,
        )
        try:
            writes = _attempt(node, task, ctx, read)
            return TaskResult(task.id, tuple(_last_resume(resumes) + writes))
        except GraphInterrupt as exc:
            return TaskResult(task.id, tuple(_last_resume(resumes)), interrupts=exc.interrupts)
        except ParentCommand as exc:
            return TaskResult(task.id, (), error=exc)
        except Exception as exc:
            policy = next((p for p in node.retry_policy if p.should_retry(exc)), None)
            if policy is None or attempt >= policy.max_attempts:
                return TaskResult(task.id, (), error=exc)
            time.sleep(policy.delay(attempt))  # retry backoff


def _last_resume(resumes: list[Write]) -> list[Write]:
    """Only the latest ``__resume__`` write counts: it lists every answer consumed."""
    last = [w for w in resumes if w[0] == RESUME][-1:]
    return [(RESUME, w[1]) for w in last]


__all__ = ["StateReader", "run_task"]
