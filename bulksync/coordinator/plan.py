"""Planning a superstep: which tasks run next, with deterministic ids. Pure; no I/O.

PUSH tasks come first, one per pending ``Send`` in ``__pregel_tasks`` (path
``(PUSH, idx, False)``); then PULL tasks, one per node whose trigger channels hold a version
newer than the node last saw (path ``(PULL, name)``). A task id hashes the checkpoint id,
the namespace, the step, the node and the trigger path or Send index (``bulksync.ids``), so
the same checkpoint always plans the same ids, in any process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import Checkpoint
from bulksync.constants import INTERRUPT, NS_END, NS_SEP, PULL, PUSH, TASKS
from bulksync.coordinator.spec import GraphSpec, NodeSpec
from bulksync.errors import InvalidGraphError
from bulksync.ids import task_id
from bulksync.types import Send, TimeoutPolicy

Channels = Mapping[str, BaseChannel[Any, Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """One planned run of a node: everything a worker needs besides the graph and state.

    ``checkpoint_ns`` is the task's own namespace (``"<parent>|<node>:<id>"``), under which
    a subgraph it runs keeps its checkpoints and its interrupts get their ids.
    """

    id: str
    name: str
    path: tuple[Any, ...]
    input: Any
    triggers: tuple[str, ...]
    step: int
    checkpoint_ns: str
    timeout: TimeoutPolicy | None = None
    """A ``Send``'s own timeout, which replaces its node's (``workers/timeouts.py``)."""

    @property
    def is_push(self) -> bool:
        """Whether this task runs a ``Send``."""
        return bool(self.path[0] == PUSH)

    def metadata(self) -> dict[str, Any]:
        """The ``langgraph_*`` keys a node sees in ``config["metadata"]``."""
        return {
            "langgraph_step": self.step,
            "langgraph_node": self.name,
            "langgraph_triggers": self.triggers,
            "langgraph_path": self.path,
            "langgraph_checkpoint_ns": self.checkpoint_ns,
        }


def task_path_str(path: Sequence[Any] | str | int) -> str:
    """The sort key of a task path: ints zero-padded, tuples as ``~a, b`` (LangGraph's rule)."""
    if isinstance(path, str):
        return path
    if isinstance(path, bool):
        return str(path)
    if isinstance(path, int):
        return f"{path:010d}"
    return "~" + ", ".join(task_path_str(p) for p in path)


def node_ns(parent_ns: str, name: str) -> str:
    """The namespace a node's task ids are hashed under."""
    return f"{parent_ns}{NS_SEP}{name}" if parent_ns else name


def read_input(node: NodeSpec, channels: Channels, managed: Mapping[str, Any] | None = None) -> Any:
    """A PULL task's input: the node's available channels (``MISSING`` if there is none),
    plus the values of the managed keys it reads (``managed``: this step's)."""
    if isinstance(node.channels, str):
        chan = channels.get(node.channels)
        if chan is None or not chan.is_available():
            return MISSING
        value = chan.get()
    else:
        value = {k: channels[k].get() for k in node.channels if channels[k].is_available()}
        value.update({k: managed[k] for k in node.managed if managed and k in managed})
    return node.mapper(value) if node.mapper is not None else value


def triggers(
    node: NodeSpec,
    channels: Channels,
    versions: Mapping[str, int],
    seen: Mapping[str, int] | None,
) -> bool:
    """Whether ``node`` runs: a trigger holds a value and a version it has not seen yet."""
    for chan in node.triggers:
        if not channels[chan].is_available():
            continue
        if seen is None or versions.get(chan, 0) > seen.get(chan, 0):
            return True
    return False


def push_tasks(
    spec: GraphSpec, checkpoint: Checkpoint, channels: Channels, step: int, parent_ns: str
) -> list[Task]:
    """One task per pending ``Send``, in Send order.

    Raises:
        InvalidGraphError: a Send names a node the graph does not have.
    """
    topic = channels.get(TASKS)
    if topic is None or not topic.is_available():
        return []
    tasks = []
    for idx, send in enumerate(topic.get()):
        if not isinstance(send, Send):
            raise InvalidGraphError(f"Pending sends hold {send!r}, which is not a Send.")
        if send.node not in spec.nodes:
            raise InvalidGraphError(
                f"Send to unknown node '{send.node}': the graph has nodes "
                f"{sorted(n for n in spec.nodes if n != '__start__')}. "
                "Send only to nodes added with add_node."
            )
        ns = node_ns(parent_ns, send.node)
        tid = task_id(checkpoint.id, ns, str(step), send.node, PUSH, str(idx))
        tasks.append(
            Task(
                id=tid,
                name=send.node,
                path=(PUSH, idx, False),
                input=send.arg,
                triggers=(PUSH,),
                step=step,
                checkpoint_ns=f"{ns}{NS_END}{tid}",
                timeout=send.timeout,
            )
        )
    return tasks


def candidate_nodes(
    spec: GraphSpec, checkpoint: Checkpoint, updated_channels: Iterable[str] | None
) -> list[str]:
    """Nodes worth testing: those triggered by the last step's updates, else all of them."""
    if not checkpoint.channel_versions:
        return []
    if updated_channels is None:
        return list(spec.nodes)  # insertion order, as LangGraph plans without a hint
    names = {n for ch in updated_channels for n in spec.trigger_to_nodes.get(ch, ())}
    return sorted(names)


def pull_tasks(
    spec: GraphSpec,
    checkpoint: Checkpoint,
    channels: Channels,
    step: int,
    parent_ns: str,
    updated_channels: Iterable[str] | None,
    managed: Mapping[str, Any] | None = None,
) -> list[Task]:
    """One task per node whose triggers changed since it last ran."""
    tasks = []
    for name in candidate_nodes(spec, checkpoint, updated_channels):
        node = spec.nodes[name]
        seen = checkpoint.versions_seen.get(name)
        if not triggers(node, channels, checkpoint.channel_versions, seen):
            continue
        value = read_input(node, channels, managed)
        if value is MISSING:
            continue
        trig = tuple(sorted(node.triggers))
        ns = node_ns(parent_ns, name)
        tid = task_id(checkpoint.id, ns, str(step), name, PULL, *trig)
        tasks.append(
            Task(
                id=tid,
                name=name,
                path=(PULL, name),
                input=value,
                triggers=trig,
                step=step,
                checkpoint_ns=f"{ns}{NS_END}{tid}",
            )
        )
    return tasks


def prepare_next_tasks(
    spec: GraphSpec,
    checkpoint: Checkpoint,
    channels: Channels,
    step: int,
    parent_ns: str = "",
    updated_channels: Iterable[str] | None = None,
    managed: Mapping[str, Any] | None = None,
) -> dict[str, Task]:
    """The tasks of step ``step``, keyed by id: PUSH tasks first, then PULL tasks.

    PULL tasks come by name when the last step's updates are known, else in node order.
    ``managed`` holds this step's managed values (``bulksync.managed``) for nodes' input.
    """
    tasks = push_tasks(spec, checkpoint, channels, step, parent_ns)
    tasks += pull_tasks(spec, checkpoint, channels, step, parent_ns, updated_channels, managed)
    return {t.id: t for t in tasks}


def should_interrupt(
    checkpoint: Checkpoint, nodes: Sequence[str] | str, tasks: Iterable[Task]
) -> list[Task]:
    """Tasks a breakpoint on ``nodes`` stops before/after (``"*"``: every visible node).

    A breakpoint fires only when some channel changed since the last one fired, so a resumed
    run passes it.
    """
    seen = checkpoint.versions_seen.get(INTERRUPT, {})
    if not any(v > seen.get(ch, 0) for ch, v in checkpoint.channel_versions.items()):
        return []
    if nodes == "*":
        return [t for t in tasks if not t.name.startswith("__")]
    return [t for t in tasks if t.name in nodes]
