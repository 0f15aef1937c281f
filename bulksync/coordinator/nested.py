"""Subgraphs: child loops, how they start, and what they take from the task that runs them.

Two ways in, one mechanism (``run_child``). A subgraph *added as a node* is run by the
parent loop itself: its own tasks go through the parent's executor, so a cluster spreads a
subgraph's fan-out like any other. A subgraph *invoked inside a node* nests under the
running task (``invoke_nested``). Either way the child keeps its checkpoints under the
task's namespace (``node:<task_id>``), inherits the parent's saver unless compiled with
``checkpointer=False``, streams under its namespace, and resumes with the parent.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bulksync.checkpoint.base import CheckpointSaver, CheckpointTuple
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, NS_END, NS_SEP
from bulksync.context import NullResume, TaskContext
from bulksync.coordinator.executor import Executor, StepInput, StepLive, TaskResult
from bulksync.coordinator.options import RunOptions
from bulksync.coordinator.plan import Task
from bulksync.coordinator.reader import StateReader, apply_parent_command
from bulksync.coordinator.spec import CompiledGraph, GraphSpec
from bulksync.errors import GraphDrained, GraphInterrupt, ParentCommand, TaskCancelledError

if TYPE_CHECKING:
    from bulksync.coordinator.loop import Outcome, SuperstepLoop


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


def start_subgraph_task(
    spec: GraphSpec,
    executor: Executor,
    task: Task,
    step: StepInput,
    live: StepLive,
    deliver: Callable[[TaskResult], None],
) -> None:
    """Run a subgraph node's task as a child loop on its own thread; deliver its result."""
    node = spec.nodes[task.name]
    subgraph = node.subgraph
    assert subgraph is not None, f"node '{node.name}' is not a subgraph node"
    reader = StateReader(spec, step)
    # The task's own level over the step's answer: it records whether the child took it.
    own = NullResume(None, live.null_resume)
    child_live = dataclasses.replace(live, null_resume=own)

    def finish(result: TaskResult) -> None:
        deliver(dataclasses.replace(result, took_null_resume=own.taken))

    def body() -> None:
        try:
            outcome = run_child(subgraph, task.input, step, child_live, task.checkpoint_ns)
            finish(TaskResult(task.id, tuple(node.writer(outcome.output, reader))))
        except GraphInterrupt as exc:
            finish(TaskResult(task.id, (), interrupts=exc.interrupts, interrupted=True))
        except GraphDrained as exc:  # the child stopped at its step boundary: not a failure
            finish(TaskResult(task.id, (), error=exc))
        except ParentCommand as exc:
            try:
                writes = apply_parent_command(node, task, exc, reader)
                finish(TaskResult(task.id, tuple(writes)))
            except BaseException as err:
                finish(TaskResult(task.id, (), error=err))
        except Exception as exc:
            if node.error_handler is None or isinstance(exc, TaskCancelledError):
                finish(TaskResult(task.id, (), error=exc))
                return
            # The subgraph failed for good: the node's error handler runs in its place,
            # as a task of the executor's told of the failure (on a worker, on a cluster).
            exc.add_note(f"During task with name '{task.name}' and id '{task.id}'")
            failed = {**step.node_errors, task.id: [node.name, exc]}
            handled = dataclasses.replace(step, node_errors=failed)
            executor.submit(spec, handled, child_live, [task], finish)
        except BaseException as exc:
            finish(TaskResult(task.id, (), error=exc))

    threading.Thread(target=body, name=f"bulksync-sub-{task.name}", daemon=True).start()


def run_child(
    compiled: CompiledGraph,
    value: Any,
    step: StepInput,
    live: StepLive,
    ns: str,
    started: Callable[[SuperstepLoop], None] | None = None,
) -> Outcome:
    """Run ``compiled`` on ``value`` as a child loop under namespace ``ns``.

    ``step`` is the parent task's step (its ``nesting`` says how to nest, its config is the
    run's); ``live`` gives the saver, executor, sink and resume answer the child shares.
    """
    from bulksync.coordinator.loop import SuperstepLoop  # (the loop starts children from here)

    options, stored_ns = child_options(compiled, step, ns)
    loop = SuperstepLoop(
        compiled.spec,
        value,
        saver=child_saver(compiled, live.saver),
        executor=live.executor,
        options=options,
        sink=live.sink,
        checkpoint_ns=stored_ns,
        nesting=step.nesting,
        null_resume=live.null_resume,
        # A persistent subgraph streams under its stored namespace, as LangGraph's does.
        namespace=tuple((stored_ns if compiled.checkpointer is True else ns).split(NS_SEP)),
        replay=live.replay,
        store=live.store,
        control=live.control,
        abandoned=live.abandoned,
        home=live.home,
        cache=live.cache,
    )
    loop.resume_map = step.resume_map  # answers by interrupt id reach the child's tasks too
    if started is not None:
        started(loop)
    return loop.run()


def invoke_nested(
    compiled: CompiledGraph,
    value: Any,
    ctx: TaskContext,
    started: Callable[[SuperstepLoop], None] | None = None,
) -> Outcome:
    """Run ``compiled`` inside the running task ``ctx`` (a graph invoked from a node);
    ``started`` gets the child loop before it runs (to stop it with its caller).

    The n-th call within one task gets namespace ``<task ns>|n`` (the first, none).
    """
    step, live, task = ctx.parent
    count = next(ctx.scratchpad.subgraph_counter)
    ns = task.checkpoint_ns if count == 0 else f"{task.checkpoint_ns}{NS_SEP}{count}"
    live = dataclasses.replace(live, null_resume=ctx.scratchpad.null_resume)
    return run_child(compiled, value, step, live, ns, started)
