"""Reading and editing a thread's state between runs: ``get_state`` and ``update_state``.

A snapshot re-plans the tasks of the step after a checkpoint (same ids as the run that
will execute them) and reads their recorded writes: the *live* view (no ``checkpoint_id``)
folds in what already finished; an addressed checkpoint shows the step as it began.
``update_state`` applies values as if a node had returned them, through that node's writer,
and commits a ``source="update"`` checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import CheckpointSaver, CheckpointTuple
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, END, INTERRUPT, NULL_TASK_ID, RETURN
from bulksync.coordinator import clock, stream
from bulksync.coordinator.apply import (
    TaskWrites,
    Versions,
    apply_writes,
    create_checkpoint,
    empty_checkpoint,
    new_versions,
)
from bulksync.coordinator.executor import StepInput
from bulksync.coordinator.options import checkpoint_metadata
from bulksync.coordinator.plan import Task, prepare_next_tasks
from bulksync.coordinator.reader import StateReader
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.coordinator.status import TaskStatus, read_task_statuses
from bulksync.errors import InvalidUpdateError, StoredError
from bulksync.types import PregelTask, StateSnapshot

Channels = dict[str, BaseChannel[Any, Any]]


def load_channels(spec: GraphSpec, saved: CheckpointTuple) -> tuple[Channels, Versions]:
    """Live channels and versions of a stored checkpoint, with its input writes applied."""
    channels = {
        k: t.from_checkpoint(saved.checkpoint.channel_values.get(k, MISSING))
        for k, t in spec.channels.items()
    }
    versions = Versions.of(saved.checkpoint)
    null_writes = [(c, v) for t, c, v in saved.pending_writes if t == NULL_TASK_ID]
    if null_writes:
        apply_writes(
            versions,
            channels,
            [TaskWrites("__input__", (), null_writes)],
            spec.trigger_to_nodes,
            version_bits=clock.version_bits(),
        )
    return channels, versions


def plan_after(spec: GraphSpec, saved: CheckpointTuple, channels: Channels) -> dict[str, Task]:
    """The tasks of the step after ``saved``."""
    step = int(saved.metadata.get("step", -1)) + 1
    ns = saved.config["configurable"].get(CHECKPOINT_NS, "")
    return prepare_next_tasks(spec, saved.checkpoint, channels, step, ns)


def snapshot(
    spec: GraphSpec,
    saved: CheckpointTuple | None,
    config: Mapping[str, Any],
    *,
    live: bool,
    task_states: Mapping[str, Any] | None = None,
) -> StateSnapshot:
    """The ``StateSnapshot`` of ``saved`` (an empty one when there is none)."""
    if saved is None:
        return StateSnapshot({}, (), dict(config), None, None, None, (), ())
    channels, versions = load_channels(spec, saved)
    tasks = plan_after(spec, saved, channels)
    statuses = read_task_statuses(saved.pending_writes)
    finished = {tid: s for tid, s in statuses.items() if tid in tasks and s.finished}
    if live and finished:
        apply_writes(
            versions,
            channels,
            [
                TaskWrites(tasks[t].name, tasks[t].path, s.output, tasks[t].triggers)
                for t, s in finished.items()
            ],
            spec.trigger_to_nodes,
            version_bits=clock.version_bits(),
        )
    keys = spec.stream_channels
    shown = tuple(
        pregel_task(t, statuses.get(t.id), keys, live, (task_states or {}).get(t.id))
        for t in tasks.values()
    )
    return StateSnapshot(
        values=stream.read_channels(channels, keys),
        next=tuple(t.name for t in tasks.values() if not (live and t.id in finished)),
        config=stream.with_checkpoint_map(saved.config, saved.metadata) or dict(saved.config),
        metadata=saved.metadata,
        created_at=saved.checkpoint.ts,
        parent_config=stream.with_checkpoint_map(saved.parent_config, saved.metadata),
        tasks=shown,
        interrupts=tuple(i for t in shown for i in t.interrupts),
    )


def pregel_task(
    task: Task, status: TaskStatus | None, keys: Any, live: bool, state: Any
) -> PregelTask:
    """How ``get_state`` shows one planned task."""
    status = status or TaskStatus()
    output = [(c, v) for c, v in status.output if c != RETURN]
    result: Any = None
    if status.finished:
        if isinstance(keys, str):
            result = stream.result_writes([w for w in output if w[0] == keys]).get(keys)
        else:
            result = stream.result_writes([w for w in output if w[0] in keys])
    # A stored error reads back as its repr, as LangGraph's serializer gives it.
    error = repr(status.error) if isinstance(status.error, StoredError) else status.error
    return PregelTask(
        task.id,
        task.name,
        task.path,
        error,
        status.pending_interrupts if live else status.interrupts,
        state,
        result,
    )


def infer_as_node(spec: GraphSpec, saved: CheckpointTuple | None) -> str:
    """The node an update without ``as_node`` is applied as (LangGraph's rule).

    Raises:
        InvalidUpdateError: when no single node last updated the state.
    """
    if len(spec.nodes) == 1:  # an entrypoint: a StateGraph's START counts as a node
        return next(iter(spec.nodes))
    seen = saved.checkpoint.versions_seen if saved else {}
    if not any(v for vs in seen.values() for v in vs.values()):
        return spec.input_channels
    last = sorted((v, n) for n, vs in seen.items() if n in spec.nodes for v in vs.values())
    if len(last) == 1 or (last and last[-1][0] != last[-2][0]):
        return last[-1][1]
    raise InvalidUpdateError("Ambiguous update, specify as_node")


Update = tuple[Any, str | None, str | None]
"""One update of a superstep: ``(values, as_node, task_id)``, as LangGraph's ``StateUpdate``."""


def update_state(
    spec: GraphSpec,
    saver: CheckpointSaver,
    config: Mapping[str, Any],
    updates: Sequence[Update],
) -> dict[str, Any]:
    """Apply one superstep of ``updates`` (each as its node's output; all in one step) and
    commit a new checkpoint; return its config.

    Raises:
        InvalidUpdateError: an unknown ``as_node``, an ambiguous update, or ``__input__`` or
            ``__copy__`` among several updates.
    """
    saved = _saved_or_empty(saver, config)
    step = int(saved.metadata.get("step", -2)) + 1
    single = len(updates) == 1
    given = {a for _, a, _ in updates}
    if "__copy__" in given and not single:
        raise InvalidUpdateError("Cannot copy checkpoint with multiple updates")
    if "__input__" in given and not single:
        raise InvalidUpdateError("Cannot apply multiple updates when updating as input")
    values, as_node, _ = updates[0]
    if as_node == "__copy__":
        parent = saved.parent_config or _unaddressed(saved)
        return _commit(saver, saved, parent, None, "fork", step, config)
    channels, versions = load_channels(spec, saved)
    tasks = plan_after(spec, saved, channels)
    if single and as_node == END and values is None:
        done = [TaskWrites(t.name, t.path, (), t.triggers) for t in tasks.values()]
        source = "update"
    elif as_node == "__input__":
        # Pending tasks stay scheduled: the input runs beside them in the next step.
        done = [TaskWrites("__input__", (), [(spec.input_channels, values)])]
        source = "input"
    else:
        done = [_node_update(spec, saver, saved, tasks, u, single) for u in updates]
        source = "update"
    apply_writes(versions, channels, done, spec.trigger_to_nodes, version_bits=clock.version_bits())
    return _commit(saver, saved, saved.config, (channels, versions), source, step, config)


def _saved_or_empty(saver: CheckpointSaver, config: Mapping[str, Any]) -> CheckpointTuple:
    """The checkpoint ``config`` names, or an empty one for a thread that has none."""
    saved = saver.get_tuple(config)
    if saved is not None:
        return saved
    ns = (config.get("configurable") or {}).get(CHECKPOINT_NS, "")
    base_conf = {**config["configurable"], CHECKPOINT_NS: ns}
    base_conf.pop(CHECKPOINT_ID, None)
    return CheckpointTuple(
        {"configurable": base_conf}, empty_checkpoint(clock.stamp(0)), {"step": -2}
    )


def _node_update(
    spec: GraphSpec,
    saver: CheckpointSaver,
    saved: CheckpointTuple,
    tasks: Mapping[str, Task],
    update: Update,
    single: bool,
) -> TaskWrites:
    """One node's update as its task's writes, recorded on the task it stands for (the
    task ``task_id`` names, else the planned task of that node)."""
    values, as_node, task_id = update
    if as_node is None and not single:
        raise InvalidUpdateError("Ambiguous update, specify as_node")
    node_name = as_node if as_node is not None else infer_as_node(spec, saved)
    if node_name not in spec.nodes:
        raise InvalidUpdateError(
            f"update_state(as_node={node_name!r}): node '{node_name}' does not exist; "
            f"use one of {sorted(n for n in spec.nodes if not n.startswith('__'))}."
        )
    writes = node_writes(spec, node_name, values, saved)
    planned = tasks.get(task_id) if task_id is not None else None
    planned = planned or next((t for t in tasks.values() if t.name == node_name), None)
    if planned is not None:
        saver.put_writes(saved.config, writes, planned.id, stream.task_path_key(planned))
    path = planned.path if planned else ("__pregel_pull", node_name)
    return TaskWrites(node_name, path, writes, (INTERRUPT,))


def node_writes(spec: GraphSpec, node: str, values: Any, saved: CheckpointTuple) -> list[Write]:
    """What ``node``'s writer makes of ``values`` (updates, edges, branches)."""
    step = StepInput(
        channel_values=dict(saved.checkpoint.channel_values),
        config={},
        stop=0,
        resume={},
        resume_map=None,
        null_resume=None,
        namespace=(),
    )
    return spec.nodes[node].writer(values, StateReader(spec, step))


def _unaddressed(saved: CheckpointTuple) -> dict[str, Any]:
    conf = dict(saved.config["configurable"])
    conf.pop(CHECKPOINT_ID, None)
    return {"configurable": conf}


def _commit(
    saver: CheckpointSaver,
    saved: CheckpointTuple,
    parent: Mapping[str, Any],
    state: tuple[Channels, Versions] | None,
    source: str,
    step: int,
    config: Mapping[str, Any],
) -> dict[str, Any]:
    if state is None:
        checkpoint = create_checkpoint(
            saved.checkpoint,
            None,
            Versions.of(saved.checkpoint),
            saved.checkpoint.updated_channels,
            stamp=clock.stamp(step),
        )
        changed = dict(saved.checkpoint.channel_versions)
    else:
        channels, versions = state
        # No updated-channel hint: tasks pending before the update must still be planned.
        checkpoint = create_checkpoint(
            saved.checkpoint, channels, versions, None, stamp=clock.stamp(step)
        )
        changed = new_versions(saved.checkpoint.channel_versions, checkpoint.channel_versions)
    parents = saved.metadata.get("parents") or {}
    metadata = checkpoint_metadata(config, source, step, dict(parents))
    return saver.put(parent, checkpoint, metadata, changed)
