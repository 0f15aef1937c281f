"""Applying a superstep's writes and making the next checkpoint. Pure; no I/O, no clock.

The state after a step depends only on the state before it and the set of task results:
tasks are applied in task-path order (``plan.task_path_str``: PULL tasks by node name, then
PUSH tasks by Send index), never in the order they finished, and every channel the step
changes gets the same new version. What must be fresh — a version's random low bits, a
checkpoint's id and time — is minted by the caller (``coordinator.clock``) and passed in,
so a recorded step replays to the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import Checkpoint
from bulksync.constants import CHECKPOINT_VERSION, CONTROL_CHANNELS, PUSH
from bulksync.coordinator.plan import task_path_str
from bulksync.coordinator.spec import Write
from bulksync.errors import InvalidUpdateError


@dataclasses.dataclass(frozen=True, slots=True)
class TaskWrites:
    """A task's writes as the apply step needs them (input writes have no path or triggers)."""

    name: str
    path: tuple[Any, ...]
    writes: Sequence[Write]
    triggers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Stamp:
    """A new checkpoint's identity, minted outside the pure core: its id and creation time."""

    id: str
    ts: str


@dataclasses.dataclass(slots=True)
class Versions:
    """The mutable bookkeeping of a thread between checkpoints."""

    channel_versions: dict[str, int]
    versions_seen: dict[str, dict[str, int]]

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> Versions:
        """A private copy of ``checkpoint``'s versions."""
        return cls(
            dict(checkpoint.channel_versions),
            {k: dict(v) for k, v in checkpoint.versions_seen.items()},
        )


def apply_writes(
    versions: Versions,
    channels: Mapping[str, BaseChannel[Any, Any]],
    tasks: Iterable[TaskWrites],
    trigger_to_nodes: Mapping[str, Sequence[str]],
    *,
    version_bits: int,
) -> set[str]:
    """Apply one step's writes to ``channels`` and ``versions``; return the updated channels.

    ``version_bits`` are the random low bits of the step's new version
    (``next_channel_version``).

    Raises:
        InvalidUpdateError: when a channel rejects the step's writes.
        Exception: a reducer's own error, with a note naming the key and the nodes.
    """
    ordered = sorted(tasks, key=lambda t: task_path_str(t.path))
    bump_step = any(t.triggers for t in ordered)
    current = versions.channel_versions
    for task in ordered:
        seen = versions.versions_seen.setdefault(task.name, {})
        for chan in task.triggers:
            if chan in current:
                seen[chan] = current[chan]
    next_version = next_channel_version(max(current.values(), default=0), version_bits)
    # Consuming a trigger bumps its version but does not count as an update.
    for chan in {c for t in ordered for c in t.triggers if c != PUSH}:
        if chan in channels and channels[chan].consume():
            current[chan] = next_version
    grouped: dict[str, list[Any]] = defaultdict(list)
    writers: dict[str, list[str]] = defaultdict(list)
    for task in ordered:
        for chan, value in task.writes:
            if chan in CONTROL_CHANNELS or chan not in channels:
                continue
            grouped[chan].append(value)
            writers[chan].append(task.name)
    updated: set[str] = set()

    def bump(chan: str) -> None:
        current[chan] = next_version
        if channels[chan].is_available():
            updated.add(chan)

    for chan, values in grouped.items():
        if _update(channels[chan], chan, values, writers[chan]):
            bump(chan)
    if bump_step:
        # A step that ran tasks clears what only lived for one step (Ephemeral, Topic).
        for chan, channel in channels.items():
            if chan not in updated and channel.is_available() and channel.update([]):
                bump(chan)
    if bump_step and updated.isdisjoint(trigger_to_nodes):
        # Nothing triggers another node: the run would end, so release deferred nodes.
        for chan, channel in channels.items():
            if channel.finish():
                bump(chan)
    return updated


VERSION_RANDOM_BITS = 20


def next_channel_version(current: int, random_bits: int) -> int:
    """A version above ``current``, unique per branch of a thread.

    The high bits count steps, so versions only grow; the low bits are ``random_bits``
    (``VERSION_RANDOM_BITS`` fresh random bits, drawn by the caller), so a fork (replay,
    ``update_state`` on an old checkpoint) never reuses a version number that the other
    branch stored with a different value. Values never depend on these numbers.
    """
    counter = (current >> VERSION_RANDOM_BITS) + 1
    return (counter << VERSION_RANDOM_BITS) | (random_bits & ((1 << VERSION_RANDOM_BITS) - 1))


def _update(channel: BaseChannel[Any, Any], key: str, values: list[Any], nodes: list[str]) -> bool:
    try:
        return channel.update(values)
    except InvalidUpdateError:
        raise
    except Exception as exc:
        names = ", ".join(sorted(set(nodes)))
        exc.add_note(
            f"bulksync: the reducer of key '{key}' raised while applying writes from node(s) "
            f"{names}; fix the reducer or the value those nodes return for '{key}'."
        )
        raise


def create_checkpoint(
    previous: Checkpoint,
    channels: Mapping[str, BaseChannel[Any, Any]] | None,
    versions: Versions,
    updated_channels: Iterable[str] | None,
    *,
    stamp: Stamp,
) -> Checkpoint:
    """The next checkpoint, named by ``stamp``: stored values of every versioned channel.

    ``channels=None`` copies ``previous``'s values (a fork); empty channels are left out.
    """
    if channels is None:
        values = dict(previous.channel_values)
    else:
        values = {}
        for key, chan in channels.items():
            if key not in versions.channel_versions:
                continue
            stored = chan.checkpoint()
            if stored is not MISSING:
                values[key] = stored
    return Checkpoint(
        v=CHECKPOINT_VERSION,
        id=stamp.id,
        ts=stamp.ts,
        channel_values=values,
        channel_versions=dict(versions.channel_versions),
        versions_seen={k: dict(v) for k, v in versions.versions_seen.items()},
        updated_channels=tuple(sorted(updated_channels)) if updated_channels is not None else None,
    )


def empty_checkpoint(stamp: Stamp) -> Checkpoint:
    """The checkpoint a new thread starts from (no values, no versions), named by ``stamp``."""
    return Checkpoint(
        v=CHECKPOINT_VERSION,
        id=stamp.id,
        ts=stamp.ts,
        channel_values={},
        channel_versions={},
        versions_seen={},
        updated_channels=None,
    )


def new_versions(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Channels whose version changed between two checkpoints (what a saver must store)."""
    return {k: v for k, v in after.items() if before.get(k) != v}
