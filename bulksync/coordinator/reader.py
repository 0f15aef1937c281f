"""What a node's writer reads back, and where a subgraph's ``Command.PARENT`` lands.

``StateReader`` rebuilds the step's channels from the stored values (the claim check) and
applies a task's own writes to a private copy, so a conditional edge sees the state as the
node left it. ``apply_parent_command`` turns a ``Command`` a subgraph sent to its parent task
into that task's writes, or sends it one level further up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import decoded
from bulksync.constants import NS_END, NS_SEP
from bulksync.coordinator.executor import StepInput
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec, NodeSpec, Write
from bulksync.errors import ParentCommand
from bulksync.types import Command


class StateReader:
    """Reads the step's channels with a task's writes applied to a private copy."""

    def __init__(
        self, spec: GraphSpec, step: StepInput, managed: Mapping[str, Any] | None = None
    ) -> None:
        self._spec = spec
        self._values = step.channel_values
        self._managed = managed or {}  # the task's managed values (bulksync.managed)

    def _channel(self, key: str) -> BaseChannel[Any, Any]:
        return self._spec.channels[key].from_checkpoint(decoded(self._values.get(key, MISSING)))

    def __call__(self, select: Sequence[str] | str, writes: Sequence[Write]) -> Any:
        keys = [select] if isinstance(select, str) else list(select)
        pending: dict[str, list[Any]] = defaultdict(list)
        for chan, value in writes:
            if chan in keys:
                pending[chan].append(value)
        values: dict[str, Any] = {}
        for key in keys:
            if key in self._managed:
                values[key] = self._managed[key]
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


def parent_namespace(task_ns: str) -> str:
    """The namespace of the task that runs the graph this task belongs to.

    A numeric segment (``…|1``, the second graph invoked inside one task) is no level of
    its own: it is dropped on either side of the task's own ``node:<id>`` segment.
    """
    parts = task_ns.split(NS_SEP)
    while parts and parts[-1].isdigit():
        parts.pop()
    if parts:
        parts.pop()
    while parts and parts[-1].isdigit():
        parts.pop()
    return NS_SEP.join(parts)


def node_path(ns: str) -> str:
    """The node names down to a task (``a:<id>|1|b:<id>`` → ``a|b``): how a
    ``Command.PARENT`` from under a persistent subgraph names the graph it is for."""
    return NS_SEP.join(part.split(NS_END)[0] for part in ns.split(NS_SEP) if not part.isdigit())


def apply_parent_command(
    node: NodeSpec, task: Task, exc: ParentCommand, read: StateReader
) -> list[Write]:
    """Writes of a ``Command`` a subgraph sent to this task, or re-raise it further up."""
    cmd = exc.command
    if cmd.graph in (task.checkpoint_ns, node_path(task.checkpoint_ns), task.name):
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
