"""Subgraphs: what a child loop takes from the task that runs it.

Two ways in, one mechanism (``loop.run_child``). A subgraph *added as a node* is run by the
parent loop itself: its own tasks go through the parent's executor, so a cluster spreads a
subgraph's fan-out like any other. A subgraph *invoked inside a node* nests under the
running task (``loop.invoke_nested``). Either way the child keeps its checkpoints under the
task's namespace (``node:<task_id>``), inherits the parent's saver unless compiled with
``checkpointer=False``, streams under its namespace, and resumes with the parent.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from bulksync.checkpoint.base import CheckpointSaver, CheckpointTuple
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, NS_END, NS_SEP
from bulksync.coordinator.executor import StepInput
from bulksync.coordinator.options import RunOptions
from bulksync.coordinator.spec import CompiledGraph


def recast_namespace(ns: str) -> str:
    """A namespace without task ids (``a:<id>|1|b:<id>`` → ``a|1|b``): where a persistent
    subgraph's checkpoints are stored. A numeric segment stays: two persistent graphs invoked
    in one node keep apart."""
    return NS_SEP.join(part.split(NS_END)[0] for part in ns.split(NS_SEP))


def subgraph_task_states(
    subgraphs: Mapping[str, CompiledGraph], config: Mapping[str, Any], tasks: Any
) -> dict[str, dict[str, Any]]:
    """For the tasks of subgraph nodes (``subgraphs``, by node), the config of the
    subgraph's checkpoints, by task id: what a snapshot's ``PregelTask.state`` shows when it
    does not read them (a persistent subgraph's namespace has no task ids)."""
    thread = (config.get("configurable") or {}).get("thread_id")
    states: dict[str, dict[str, Any]] = {}
    for task in tasks:
        subgraph = subgraphs.get(task.name)
        if subgraph is None:
            continue
        ns = task.checkpoint_ns
        if subgraph.checkpointer is True:
            ns = recast_namespace(ns)
        states[task.id] = {"configurable": {"thread_id": thread, CHECKPOINT_NS: ns}}
    return states


class ReplayState:
    """A run replaying an old checkpoint, as its subgraphs see it.

    The first time a subgraph runs in the replay, it starts from its own last checkpoint
    taken before the replayed one (its state as of then, or none), not from its latest: an
    interrupt it had answered since is asked again, state it gathered since is not there.
    Later runs of the same subgraph (a loop) load their latest as usual. Subgraph tasks run
    on threads of their own, hence the lock.

    ``pins`` name the checkpoint a subgraph starts from instead, by namespace without task
    ids: a run addressed to a subgraph's checkpoint (time travel into it) replays its parents
    as of then and that subgraph from that very checkpoint.
    """

    def __init__(self, checkpoint_id: str, pins: Mapping[str, str] | None = None) -> None:
        self.checkpoint_id = checkpoint_id
        self.pins = dict(pins or {})
        self._visited: set[str] = set()
        self._lock = threading.Lock()

    def pinned(self, checkpoint_ns: str) -> str | None:
        """The checkpoint id the subgraph at ``checkpoint_ns`` is pinned to, if any."""
        return self.pins.get(recast_namespace(checkpoint_ns))

    def first_visit(self, checkpoint_ns: str) -> bool:
        """Whether this is the subgraph's first run in the replay (task ids ignored)."""
        stable = checkpoint_ns.rsplit(NS_END, 1)[0]
        with self._lock:
            first = stable not in self._visited
            self._visited.add(stable)
        return first

    def load(self, saver: CheckpointSaver, config: Mapping[str, Any]) -> CheckpointTuple | None:
        """The subgraph's pinned checkpoint, else its last one before the replayed one (None:
        there is none)."""
        conf = config.get("configurable") or {}
        pin = self.pinned(conf.get(CHECKPOINT_NS, ""))
        if pin is not None:
            return saver.get_tuple({"configurable": {**conf, CHECKPOINT_ID: pin}})
        before = {"configurable": {CHECKPOINT_ID: self.checkpoint_id}}
        return next(iter(saver.list(config, before=before, limit=1)), None)


def child_saver(compiled: CompiledGraph, parent: CheckpointSaver | None) -> CheckpointSaver | None:
    """The saver a subgraph uses: its own, the parent's (None/True), or none (False)."""
    own = compiled.checkpointer
    if own is None or own is True:
        return parent
    if own is False:
        return None
    saver: CheckpointSaver = own
    return saver


def child_options(compiled: CompiledGraph, step: StepInput, ns: str) -> tuple[RunOptions, str]:
    """The run options and stored namespace of ``compiled`` run under namespace ``ns``.

    ``step`` is the parent task's step: its config is the run's, its ``nesting`` says how to
    nest. A subgraph compiled with ``checkpointer=True`` keeps one history across calls, so
    it is stored under the namespace without task ids.
    """
    nesting = step.nesting
    assert nesting is not None, "the parent step has no nesting record"
    stored_ns = recast_namespace(ns) if compiled.checkpointer is True else ns
    conf = dict(step.config.get("configurable") or {})
    conf.pop(CHECKPOINT_ID, None)
    conf[CHECKPOINT_NS] = stored_ns
    options = RunOptions(
        config={**step.config, "configurable": conf},
        recursion_limit=nesting.recursion_limit,
        durability=nesting.durability,
        interrupt_before=compiled.interrupt_before,
        interrupt_after=compiled.interrupt_after,
        output_keys=compiled.spec.output_channels,
        modes=frozenset(nesting.modes),
        subgraphs=nesting.subgraphs,
        context=step.context,  # a subgraph runs with its parent's context
        step_timeout=compiled.step_timeout,
    )
    return options, stored_ns
