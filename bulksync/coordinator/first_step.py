"""A loop's first step: take its input, or resume, replay or fork the thread it runs on.

What the input means depends on the checkpoint the loop stands on, as in LangGraph:

- ``None``, or a ``Command``, on a thread with a checkpoint **resumes** it: the input writes
  left pending there (a resume answer, an update) apply, and the step's unfinished tasks run;
- a run addressed to a checkpoint by id (time travel) **replays** from it: its tasks run again
  rather than take the results recorded there. Resumed there, the run first commits a
  **fork** of it (unless an update or a fork made it), so the thread's history stays as it
  was;
- any other input is **applied** to ``START``'s channels and stored as the ``input``
  checkpoint (deferred, so that a first step running no user code shares its transaction).

A subgraph resumes with its parent task, and starts again on its old state when replayed.
``find_origin`` finds the checkpoint a ``SuperstepLoop`` starts from when it is made;
``start`` sets the loop up from it before its first tick.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bulksync.checkpoint.base import CheckpointSaver, CheckpointTuple, PendingWrite
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, INTERRUPT, NULL_TASK_ID, RESUME
from bulksync.context import NullResume
from bulksync.coordinator import clock
from bulksync.coordinator.apply import TaskWrites, apply_writes
from bulksync.coordinator.commands import command_writes, is_resume_map
from bulksync.coordinator.executor import Nesting
from bulksync.coordinator.ledger import Ledger, load_head
from bulksync.coordinator.nested import ReplayState
from bulksync.coordinator.options import RunOptions
from bulksync.coordinator.spec import Write
from bulksync.coordinator.status import pending_interrupt_ids
from bulksync.errors import EmptyInputError
from bulksync.types import Command

if TYPE_CHECKING:
    from bulksync.coordinator.loop import SuperstepLoop


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    """The checkpoint a loop starts from, and how it was found."""

    saved: CheckpointTuple | None
    superseded: bool
    """The thread has moved past it: its finished tasks run again."""
    replayed: bool
    """A subgraph's first run in a replayed parent: it starts from its state as of then."""
    pinned: bool
    """A replayed subgraph pinned by time travel into it: it goes on from that checkpoint."""
    addressed: bool
    """A root run addressed to a checkpoint by id (replay or fork), or a pinned subgraph."""


def find_origin(
    saver: CheckpointSaver | None,
    options: RunOptions,
    checkpoint_ns: str,
    nesting: Nesting | None,
    replay: ReplayState | None,
) -> Origin:
    """The checkpoint a loop under ``checkpoint_ns`` starts from (``nesting``: a child loop's;
    ``replay``: its run's replay, if any)."""
    replayed = bool(replay and nesting is not None and saver and replay.first_visit(checkpoint_ns))
    if replayed:
        assert replay is not None and saver is not None
        conf = {**(options.config.get("configurable") or {}), CHECKPOINT_NS: checkpoint_ns}
        conf.pop(CHECKPOINT_ID, None)
        saved, superseded = replay.load(saver, {"configurable": conf}), False
    else:
        saved, superseded = load_head(
            saver, options.config, checkpoint_ns, nested=nesting is not None
        )
    pinned = replayed and replay is not None and bool(replay.pinned(checkpoint_ns))
    conf = options.config.get("configurable") or {}
    addressed = (bool(conf.get(CHECKPOINT_ID)) and nesting is None) or pinned
    return Origin(saved, superseded, replayed, pinned, addressed)


def start(loop: SuperstepLoop) -> None:
    """Take ``loop``'s input: resume, replay or fork its thread, or apply the input.

    Raises:
        EmptyInputError: no input, and no checkpoint to resume; or an empty ``Command``.
        RuntimeError: a resume answer without a checkpointer, or one answer for several
            pending interrupts.
    """
    is_command = isinstance(loop.input, Command)
    has_state = bool(loop.versions.channel_versions)
    loop.is_resuming = _resumes(loop, is_command=is_command, has_state=has_state)
    time_travel = loop.origin.addressed and not (is_command and loop.input.resume is not None)
    if time_travel:  # this run's subgraphs replay too (keeping pins further down)
        pins = loop.replay.pins if loop.replay is not None else {}
        loop.replay = ReplayState(replayed_id(loop.ledger), pins)
    loop.is_replaying = time_travel or loop.origin.superseded
    pending = loop.ledger.pending
    if time_travel:
        pending.drop(RESUME)
    forks = (
        loop.is_resuming
        and time_travel
        and (loop.ledger.metadata.get("source") not in ("update", "fork") or loop.origin.superseded)
    )
    before_input = loop.null_resume
    _apply_pending_input(loop, is_command=is_command, forks=forks)
    if loop.is_resuming:
        loop.versions.versions_seen[INTERRUPT] = dict(loop.versions.channel_versions)
        if forks:
            pending.drop(INTERRUPT)
            loop.commit("fork")
        loop.stream.values(loop.channels)
    elif loop.input is not None and not (is_command and has_state):
        if is_command:
            # A Command sent to a thread with no checkpoint: as LangGraph does, it is the
            # input of START too (its update applies twice), and its resume answer goes
            # with the pending writes the input checkpoint leaves behind.
            loop.null_resume = before_input
        _apply_input(loop, loop.input)
    elif not (loop.nesting is not None and loop.nesting.resuming):
        raise EmptyInputError(
            f"Received no input for {loop.spec.input_channels}: pass an input, or resume "
            "an existing thread (its config must name a thread with a checkpoint)."
        )


def replayed_id(ledger: Ledger) -> str:
    """The checkpoint subgraphs replay from: the addressed one, or, for a checkpoint an
    update or fork made, the one it was made from (the subgraphs' state is that one's)."""
    source = ledger.metadata.get("source")
    parent = (ledger.parent_config or {}).get("configurable") or {}
    if source in ("update", "fork") and parent.get(CHECKPOINT_ID):
        return str(parent[CHECKPOINT_ID])
    return ledger.checkpoint.id


def _resumes(loop: SuperstepLoop, *, is_command: bool, has_state: bool) -> bool:
    """Whether the loop resumes its thread (and, for a root graph, tell ``on_resume``)."""
    if loop.nesting is not None:
        # A replayed subgraph runs its input again on its old state, not resumes; one
        # pinned by time travel into it goes on from its pinned checkpoint.
        resumes = loop.nesting.resuming and not loop.origin.replayed
        return has_state and (resumes or loop.origin.pinned)
    resuming = has_state and (loop.input is None or is_command)
    if resuming and loop.options.on_resume is not None:
        loop.options.on_resume(loop.checkpoint.id)
    return resuming


def _apply_pending_input(loop: SuperstepLoop, *, is_command: bool, forks: bool) -> None:
    """Apply the input writes left pending on the checkpoint, with a ``Command``'s own: its
    writes are recorded as pending input, or carried into the fork."""
    carried: list[PendingWrite] = []
    if is_command:
        writes = _command_input(loop, loop.input)
        if forks:
            carried = [(NULL_TASK_ID, c, v) for c, v in writes]
        elif writes:
            loop.ledger.record_input(writes)
    null_writes = [(c, v) for t, c, v in (*loop.ledger.pending, *carried) if t == NULL_TASK_ID]
    for chan, value in null_writes:
        if chan == RESUME and value is not None:
            loop.null_resume = NullResume(value, loop.null_resume)
    if null_writes:
        changed = apply_writes(
            loop.versions,
            loop.channels,
            [TaskWrites("__input__", (), null_writes)],
            loop.spec.trigger_to_nodes,
            version_bits=clock.version_bits(),
        )
        if loop.updated_channels is not None:
            loop.updated_channels |= changed


def _command_input(loop: SuperstepLoop, cmd: Command[Any]) -> list[Write]:
    """The writes of ``cmd``; a resume answer by interrupt id is kept as the loop's map."""
    if cmd.resume is not None:
        if loop.saver is None:
            raise RuntimeError(
                "Cannot use Command(resume=...) without checkpointer: compile the graph "
                "with checkpointer=... and pass a thread_id."
            )
        if is_resume_map(cmd.resume):
            loop.resume_map = dict(cmd.resume)
        elif len(pending_interrupt_ids(loop.ledger.pending.rows)) > 1:
            raise RuntimeError(
                "When there are multiple pending interrupts, you must specify the "
                "interrupt id when resuming: Command(resume={interrupt.id: value, ...})."
            )
    writes = command_writes(cmd, loop.spec, resume_is_map=loop.resume_map is not None)
    if not writes and loop.resume_map is None:
        raise EmptyInputError("Received empty Command input: set update, goto or resume.")
    return writes


def _apply_input(loop: SuperstepLoop, value: Any) -> None:
    """Apply ``value`` to ``START``'s channels and commit the ``input`` checkpoint."""
    discard = loop.plan()
    loop.updated_channels = apply_writes(
        loop.versions,
        loop.channels,
        [
            *(TaskWrites(t.name, t.path, (), t.triggers) for t in discard.values()),
            TaskWrites("__input__", (), [(loop.spec.input_channels, value)]),
        ],
        loop.spec.trigger_to_nodes,
        version_bits=clock.version_bits(),
    )
    # Stored with the next step's checkpoint when that step runs no user code (START
    # mapping the input): one transaction for both (``run_tasks`` stores it otherwise).
    loop.commit("input", defer=True)
