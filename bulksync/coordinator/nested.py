"""Subgraphs: a compiled graph run as a nested loop under the task that calls it.

Two ways in, one mechanism. A subgraph *added as a node* is run by the parent loop itself
(``start_subgraph_task``): its own tasks go through the parent's executor, so a cluster
spreads a subgraph's fan-out like any other. A subgraph *invoked inside a node* nests under
the running task (``invoke_nested``). Either way the child keeps its checkpoints under the
task's namespace (``node:<task_id>``), inherits the parent's saver unless compiled with
``checkpointer=False``, streams under its namespace, and resumes with the parent.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, NS_END, NS_SEP
from bulksync.context import NullResume, TaskContext
from bulksync.coordinator.executor import Executor, StepInput, StreamSink, TaskResult
from bulksync.coordinator.options import RunOptions
from bulksync.coordinator.plan import Task
from bulksync.errors import GraphInterrupt, ParentCommand

if TYPE_CHECKING:
    from bulksync.coordinator.loop import Outcome, SuperstepLoop


@dataclasses.dataclass(frozen=True, slots=True)
class NestedInfo:
    """What a child loop takes from the loop of its parent task."""

    saver: CheckpointSaver | None
    executor: Executor
    sink: StreamSink
    options: RunOptions
    resuming: bool
    null_resume: NullResume
    checkpoint_map: Mapping[str, str]

    @classmethod
    def of(cls, loop: SuperstepLoop) -> NestedInfo:
        """The nesting context a loop gives its step's tasks."""
        parents = dict(loop.nesting.checkpoint_map) if loop.nesting else {}
        parents[loop.checkpoint_ns] = loop.checkpoint.id
        return cls(
            saver=loop.saver,
            executor=loop.executor,
            sink=loop.sink,
            options=loop.options,
            resuming=loop.is_resuming,
            null_resume=loop.null_resume,
            checkpoint_map=parents,
        )


def recast_namespace(ns: str) -> str:
    """A namespace without task ids (``a:<id>|b:<id>`` → ``a|b``), for persistent subgraphs."""
    return NS_SEP.join(part.split(NS_END)[0] for part in ns.split(NS_SEP))


def child_saver(compiled: Any, parent: CheckpointSaver | None) -> CheckpointSaver | None:
    """The saver a subgraph uses: its own, the parent's (None/True), or none (False)."""
    own = compiled.checkpointer
    if own is None or own is True:
        return parent
    if own is False:
        return None
    saver: CheckpointSaver = own
    return saver


def run_child(compiled: Any, value: Any, info: NestedInfo, ns: str) -> Outcome:
    """Run ``compiled`` on ``value`` as a nested loop under namespace ``ns``."""
    from bulksync.coordinator.loop import Nesting, SuperstepLoop

    stored_ns = recast_namespace(ns) if compiled.checkpointer is True else ns
    conf = dict(info.options.config.get("configurable") or {})
    conf.pop(CHECKPOINT_ID, None)
    conf[CHECKPOINT_NS] = stored_ns
    options = dataclasses.replace(
        info.options,
        config={**info.options.config, "configurable": conf},
        interrupt_before=compiled.interrupt_before,
        interrupt_after=compiled.interrupt_after,
        output_keys=compiled.spec.output_channels,
    )
    loop = SuperstepLoop(
        compiled.spec,
        value,
        saver=child_saver(compiled, info.saver),
        executor=info.executor,
        options=options,
        sink=info.sink,
        checkpoint_ns=stored_ns,
        nesting=Nesting(
            resuming=info.resuming,
            null_resume=info.null_resume,
            checkpoint_map=info.checkpoint_map,
        ),
    )
    loop.namespace = tuple(ns.split(NS_SEP))
    return loop.run()


def start_subgraph_task(
    loop: SuperstepLoop, task: Task, step: StepInput, deliver: Callable[[TaskResult], None]
) -> None:
    """Run a subgraph node's task as a nested loop on its own thread; deliver its result."""
    from bulksync.workers.execute import StateReader, apply_parent_command

    node = loop.spec.nodes[task.name]
    info = NestedInfo.of(loop)
    reader = StateReader(loop.spec, step)

    def body() -> None:
        try:
            outcome = run_child(node.subgraph, task.input, info, task.checkpoint_ns)
            deliver(TaskResult(task.id, tuple(node.writer(outcome.output, reader))))
        except GraphInterrupt as exc:
            deliver(TaskResult(task.id, (), interrupts=exc.interrupts))
        except ParentCommand as exc:
            try:
                writes = apply_parent_command(node, task, exc, reader)
                deliver(TaskResult(task.id, tuple(writes)))
            except BaseException as err:
                deliver(TaskResult(task.id, (), error=err))
        except BaseException as exc:
            deliver(TaskResult(task.id, (), error=exc))

    threading.Thread(target=body, name=f"bulksync-sub-{task.name}", daemon=True).start()


def invoke_nested(compiled: Any, value: Any, ctx: TaskContext) -> Outcome:
    """Run ``compiled`` inside the running task ``ctx`` (a graph invoked from a node).

    The n-th call within one task gets namespace ``<task ns>|n`` (the first, none).
    """
    info, task = ctx.parent
    count = next(ctx.scratchpad.subgraph_counter)
    ns = task.checkpoint_ns if count == 0 else f"{task.checkpoint_ns}{NS_SEP}{count}"
    info = dataclasses.replace(info, null_resume=ctx.scratchpad.null_resume)
    return run_child(compiled, value, info, ns)
