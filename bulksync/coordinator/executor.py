"""The seam between the superstep loop and whatever runs node tasks.

The loop hands an ``Executor`` one step's tasks plus a ``StepInput`` (the step's stored
channel values — everything a task reads — and the run's resume answers: plain data, the
record a cluster executor ships to its workers as is) and, next to it, a ``StepLive`` (the
stream sink and the other live objects, which stay in the process that holds them). It
blocks until each task's ``TaskResult`` is delivered. It assumes nothing about where tasks
run: the in-process executor uses threads, a cluster executor ships the records to workers,
whose side rebuilds a ``StepLive`` of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.context import NullResume
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.types import Interrupt

StreamSink = Callable[[tuple[str, ...], str, Any], None]
"""Receives ``(namespace, mode, chunk)`` stream events of a run and its subgraphs."""


@dataclasses.dataclass(frozen=True, slots=True)
class CallRecord:
    """A ``@task`` call a node made (``workers/calls.py``): a task of the same step, whose
    writes (``__return__``, ``__resume__``) the loop stores as that task's pending writes."""

    task_id: str
    name: str
    path: str
    """The call's task path key (``stream.task_path_key``): its pending writes' order."""
    writes: tuple[Write, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TaskResult:
    """What one task produced: its writes, or the error or interrupts that stopped it.

    ``writes`` include control writes (``__resume__`` answers consumed so far) even when the
    task was interrupted; an errored task's ``writes`` hold only the ``__node_error__`` a
    crashed error handler leaves (recorded with its error, for a resumed run). A write's
    value may be an ``Encoded`` (a worker's bytes): the loop stores those bytes as they are.
    """

    task_id: str
    writes: tuple[Write, ...] = ()
    error: BaseException | None = None
    interrupts: tuple[Interrupt, ...] = ()
    interrupted: bool = False
    """Whether the task paused: it raised ``interrupts``, or a graph it runs stopped at one
    of its breakpoints (then ``interrupts`` is empty). Either way it has not finished."""
    took_null_resume: bool = False
    """Whether the task consumed the run-wide ``Command(resume=v)`` answer. A worker consumes
    its own copy of it, so the loop consumes the run's answer when it records the result:
    the next question is not answered with it again."""
    calls: tuple[CallRecord, ...] = ()
    """The ``@task`` calls the task made that ended, whatever became of the task itself."""
    handled_by: str = ""
    """The error handler whose output ``writes`` are, when the node failed for good (its
    update streams under the handler's name, as in LangGraph)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Nesting:
    """How a child loop nests under the task that runs it: the data part, which travels.

    A subgraph run by the loop and a graph invoked inside a node (in this process or on a
    worker) all nest from this record plus a ``StepLive``; ``checkpoint_map`` names the
    checkpoint of every enclosing namespace.
    """

    recursion_limit: int
    durability: str
    modes: tuple[str, ...]
    resuming: bool
    checkpoint_map: Mapping[str, str]
    subgraphs: bool = False
    """The run's caller reads its subgraphs' events too (``stream(subgraphs=True)``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepInput:
    """What every task of a step shares besides the graph: plain data, safe to ship.

    ``channel_values`` is the step's state as stored (a claim check: one copy per step, not
    per task), without the pending Sends; a value may be an ``Encoded`` whose bytes are
    already known, so shipping it costs no encoding. ``resume`` maps a task id to the
    interrupt answers it already consumed; ``null_resume`` is the run-wide answer not yet
    consumed (``None``: none).
    ``nesting`` says how a graph invoked inside a node nests under its task.
    """

    channel_values: Mapping[str, Any]
    config: Mapping[str, Any]
    stop: int
    resume: Mapping[str, list[Any]]
    resume_map: Mapping[str, Any] | None
    null_resume: Any
    namespace: tuple[str, ...]
    nesting: Nesting | None = None
    context: Any = None
    """The run's ``invoke(..., context=...)``, for each task's ``Runtime``."""
    returns: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Results of ``@task`` calls that finished in an earlier attempt, by call task id."""
    node_errors: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """``[node, error]`` by task id, for tasks whose node failed for good before (in an
    earlier attempt of this step, whose handler crashed; or a subgraph node, which the loop
    runs): their error handler runs in their place."""
    trace: Mapping[str, Any] | None = None
    """On a worker: the run's LangChain callback handlers, as ``callback_relay.describe``
    gives them; its tasks report to a relay that sends their callbacks back to them."""
    checkpointed: bool = False
    """Whether the run has a saver: graphs its tasks invoke checkpoint through it."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepLive:
    """What a step's tasks use that cannot travel, passed next to its ``StepInput``.

    ``sink`` receives the tasks' stream events; ``null_resume`` hands the run-wide resume
    answer to exactly one interrupt; a graph invoked inside a node nests on ``executor``
    and checkpoints through ``saver`` (``None`` on a worker: checkpoints stay with the
    coordinator).
    """

    sink: StreamSink
    null_resume: NullResume
    executor: Executor
    saver: CheckpointSaver | None = None
    replay: Any = None
    """The run's ``nested.ReplayState`` when it replays an old checkpoint (subgraphs run by
    the loop start from their state as of then)."""
    store: Any = None
    """The run's ``store.BaseStore`` (``compile(store=...)``), for ``Runtime.store``."""
    control: Any = None
    """The run's ``runtime.RunControl``, for ``Runtime.control`` (None on workers)."""
    abandoned: Any = None
    """A ``threading.Event`` set when the caller stopped reading the run's stream: the run's
    loops, child loops included, stop before their next step."""
    cache: Any = None
    """The run's node cache (``bulksync.cache``), for ``@task`` calls with a cache policy."""
    home: Any = None
    """The event loop of the run's async caller, where an in-process executor runs its
    async nodes (``workers/cancel_scope.py``); None on workers and for sync callers."""
    lone: bool = False
    """The step has this one task and no ``step_timeout``, and the thread submitting it is
    the run's own, free to wait for it: an in-process executor may run a sync node right
    there (as LangGraph does) rather than start a thread for it."""
    starting: Callable[[], None] | None = None
    """Stores the checkpoint the step starts from, if it is still on its way: an executor
    whose ``calls_starting`` is true calls it right before the first of the step's tasks
    can start (its messages sent), so that the loop's work before that overlaps the
    commit; it may raise the commit's error (then nothing of the step may start)."""


class StepHandle(Protocol):
    """A step in flight.

    A handle may also have ``forget()``, which the loop calls once the step's checkpoint is
    committed (the step will never run again): an executor that keeps results to recover a
    step (``CeleryStep``) may drop them then.
    """

    def cancel(self) -> None:
        """Stop the step's unfinished tasks; each gets a ``TaskCancelledError`` result."""


class Executor(Protocol):
    """Runs a step's tasks and delivers exactly one result per task, in completion order.

    A task stopped by ``StepHandle.cancel`` (or by the run being cancelled) is delivered with
    ``error=TaskCancelledError``; a task that outran the executor's task time limit with
    ``TaskTimeoutError``. An executor with a true ``calls_starting`` attribute calls
    ``StepLive.starting`` before any task of a step can start; for any other, the loop has
    stored the step's checkpoint before ``submit``.
    """

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        live: StepLive,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> StepHandle:
        """Start ``tasks``; call ``deliver`` from any thread as each one finishes."""
