"""What a loop has stored: the checkpoint it stands on, the writes recorded against it.

The ledger is the loop's only contact with the saver. It loads the thread's head (or the
addressed checkpoint), records each task's writes as pending writes the moment they arrive,
and commits a checkpoint per step. Under ``durability="exit"`` nothing reaches the saver
until the run stops, when the last checkpoint and its writes are stored together.

A value is encoded once: a write that arrives as ``Encoded`` (a worker's bytes) is stored
with those bytes, and becomes its ``LastValue`` channel's blob without being encoded again;
any other changed channel value is encoded once per new version. The ledger keeps those
bytes so that the next step's input ships them as they are (``with_bytes``). A list that
only appends to its stored value is stored as the items it appends (``appends.py``): a long
chat costs each step its new messages, not the whole history again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from bulksync import collector
from bulksync.channels.base import BaseChannel
from bulksync.channels.last_value import LastValue
from bulksync.checkpoint.appends import appended, delta
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointSaver,
    CheckpointTuple,
    Encoded,
    PendingWrite,
    Step,
    checkpoint_config,
    config_thread,
    decoded,
    put_steps,
    put_steps_soon,
    put_writes_batch,
    stores_steps_together,
)
from bulksync.checkpoint.serde import dumps_for
from bulksync.constants import (
    CHECKPOINT_ID,
    CHECKPOINT_NS,
    ERROR,
    INTERRUPT,
    NULL_TASK_ID,
    RESUME,
    THREAD_ID,
    WRITES_IDX_MAP,
)
from bulksync.coordinator import clock
from bulksync.coordinator.apply import (
    Stamp,
    Versions,
    create_checkpoint,
    empty_checkpoint,
    new_versions,
)
from bulksync.coordinator.options import RunOptions, checkpoint_metadata
from bulksync.coordinator.spec import Write
from bulksync.errors import SerializationError

STORE_AT = 100
"""Tasks' writes ``batched`` keeps back at most: a fan-out's results go in a few large
transactions, not one per handful that arrived together (Postgres spends about 1 ms of CPU
per transaction, more than on 25 rows)."""

STORE_WITHIN = 0.02
"""Seconds a kept task's writes wait at most before they are stored. On the cluster its
result stays in Redis until the step's checkpoint is committed, so a coordinator that stops
meanwhile finds it there. In process, a crash within that time runs the task again, as one
while LangGraph's own background ``put_writes`` is in flight does."""

SPECIAL = (ERROR, INTERRUPT, RESUME)
"""Pending-write channels whose rows replace a task's earlier rows rather than add to them."""


class PendingWrites:
    """Writes recorded against the current checkpoint, as ``(task id, channel, value)`` rows.

    A task's error, interrupt and resume rows replace its earlier ones. Only the tasks known
    to have such rows are filtered, so recording a step stays linear in its fan-out.
    """

    def __init__(self, rows: Iterable[PendingWrite] = ()) -> None:
        self.rows: list[PendingWrite] = list(rows)
        self._special = {w[0] for w in self.rows if w[1] in SPECIAL}
        # The rows as loaded (already stored), kept so that their ids stay theirs.
        self._loaded = list(self.rows)
        self._loaded_ids = {id(w) for w in self._loaded}

    def unstored(self) -> list[PendingWrite]:
        """What a ``durability="exit"`` run stores: the rows not loaded from the saver, the
        fixed-slot ones (error, interrupt, resume: a store replaces them), and every input
        row (the run's ``Command`` updates, stored in full so that each keeps its slot)."""
        return [
            w
            for w in self.rows
            if id(w) not in self._loaded_ids or w[1] in WRITES_IDX_MAP or w[0] == NULL_TASK_ID
        ]

    def __iter__(self) -> Iterator[PendingWrite]:
        return iter(self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def add(self, task_id: str, writes: Sequence[Write]) -> None:
        """Record ``writes`` of ``task_id`` (its special rows replace the earlier ones)."""
        if task_id in self._special:
            self.rows = [w for w in self.rows if not (w[0] == task_id and w[1] in SPECIAL)]
        if any(c in SPECIAL for c, _ in writes):
            self._special.add(task_id)
        self.rows.extend((task_id, c, v) for c, v in writes)

    def drop(self, channel: str) -> None:
        """Forget every row written to ``channel``."""
        self.rows = [w for w in self.rows if w[1] != channel]
        self._special = {w[0] for w in self.rows if w[1] in SPECIAL}

    def clear(self) -> None:
        """Forget every row (a new checkpoint was committed)."""
        self.rows = []
        self._special = set()
        self._loaded, self._loaded_ids = [], set()


def load_head(
    saver: CheckpointSaver | None, config: Mapping[str, Any], checkpoint_ns: str, *, nested: bool
) -> tuple[CheckpointTuple | None, bool]:
    """The checkpoint a run starts from, and whether the thread has moved past it.

    A root run may address an older checkpoint (``checkpoint_id``: replay or fork); a nested
    run always starts from its namespace's head.
    """
    if saver is None:
        return None, False
    config_thread(config)  # a saver needs a thread id
    conf = dict(config.get("configurable") or {})
    lookup = {**conf, CHECKPOINT_NS: checkpoint_ns}
    if nested:
        lookup.pop(CHECKPOINT_ID, None)
    saved = saver.get_tuple({"configurable": lookup})
    if not lookup.get(CHECKPOINT_ID) or saved is None:
        return saved, False
    head = saver.get_tuple(
        {"configurable": {k: v for k, v in lookup.items() if k != CHECKPOINT_ID}}
    )
    return saved, head is not None and head.checkpoint.id != saved.checkpoint.id


_Recorded = tuple[str, str, Sequence[Write], str, Sequence[Write]]
"""A task's writes ``batched`` holds: task id, path, writes as given, node, plain writes."""


class Ledger:
    """The checkpoint a loop stands on, its pending writes, and the saver I/O for both."""

    def __init__(
        self,
        saver: CheckpointSaver | None,
        options: RunOptions,
        saved: CheckpointTuple | None,
        *,
        checkpoint_ns: str,
        parents: Mapping[str, str],
    ) -> None:
        self.saver = saver
        self.options = options
        self.parents = dict(parents)
        thread_id = (options.config.get("configurable") or {}).get(THREAD_ID)
        self.config: dict[str, Any] = {
            "configurable": {THREAD_ID: thread_id, CHECKPOINT_NS: checkpoint_ns}
        }
        self.parent_config: dict[str, Any] | None = None
        if saved is not None:
            self.checkpoint: Checkpoint = saved.checkpoint
            self.metadata: dict[str, Any] = dict(saved.metadata)
            self.pending = PendingWrites(saved.pending_writes)
            self.config = saved.config
            self.parent_config = saved.parent_config
        else:
            self.checkpoint = empty_checkpoint(clock.stamp(0))
            self.metadata = {"step": -2}
            self.pending = PendingWrites()
        self._saved_versions = dict(self.checkpoint.channel_versions)
        # The id of the checkpoint the saver holds as the head: the exit commit of a run that
        # made no checkpoint of its own (a resume paused in its first step) stores nothing.
        self._saved_id = saved.checkpoint.id if saved is not None else None
        # The config of the saver's head: the parent of the next checkpoint stored. Under
        # ``durability="exit"`` the steps between are never stored, so none is a parent.
        self._saved_config: dict[str, Any] = dict(self.config)
        # Bytes already made for values the loop holds, so none is encoded twice: this step's
        # encoded writes by channel, and each channel's stored value at its version.
        self._write_bytes: dict[str, list[Encoded]] = {}
        self._channel_bytes: dict[str, tuple[Any, Encoded]] = {}
        # Each list channel's items as the saver holds them, and at which version: a value
        # that only appends to them is stored as what it appends (``appends.py``).
        self._stored_items: dict[str, tuple[int, tuple[Any, ...]]] = {}
        if saved is not None:
            for chan, value in saved.checkpoint.channel_values.items():
                version = saved.checkpoint.channel_versions.get(chan)
                if type(value) is list and isinstance(version, int):
                    self._stored_items[chan] = (version, tuple(value))
        # Writes recorded inside ``batched()``; those it kept back, since when, and whether
        # they wait for the step's checkpoint (``hold``).
        self._batch: list[_Recorded] | None = None
        self._held: list[_Recorded] = []
        self._kept_since = 0.0
        self._hold = False
        # A checkpoint committed with ``defer``, not stored yet (``store_deferred``).
        self._deferred: Step | None = None
        # The confirmation of a checkpoint committed ``soon``, and what waits for it.
        self._in_flight: Callable[[], None] | None = None
        self._when_stored: list[Callable[[], None]] = []

    @property
    def durable(self) -> bool:
        """Whether writes and checkpoints reach the saver as they happen."""
        return self.saver is not None and self.options.durability != "exit"

    def commit(
        self,
        source: str,
        channels: Mapping[str, BaseChannel[Any, Any]],
        versions: Versions,
        step: int,
        updated_channels: set[str] | None,
        *,
        defer: bool = False,
        soon: bool = False,
    ) -> None:
        """Make the checkpoint of ``step`` from the channels; store it unless durability waits.

        ``source="exit"`` rewrites the last checkpoint in place (same id and metadata) to
        store it at the end of a ``durability="exit"`` run. ``defer``: a saver that stores
        several checkpoints at once (``put_steps``) stores this one with the next, in one
        transaction, unless something else reaches the saver first (``store_deferred``).
        ``soon``: a saver that can (``put_steps_soon``) is sent the commit now, confirmed
        (``confirm``) when something else reaches the saver, a task is to start, or the loop
        is to wait: meanwhile the loop plans its next step while Postgres commits.
        """
        exiting = source == "exit"
        if exiting and self.checkpoint.id == self._saved_id:
            return  # stored already; its input writes stay pending writes, applied on resume
        if not exiting:
            self.metadata = checkpoint_metadata(self.options.config, source, step, self.parents)
        self.checkpoint = create_checkpoint(
            self.checkpoint,
            channels,
            versions,
            updated_channels,
            # The exit checkpoint stores the last step's checkpoint under its own id.
            stamp=Stamp(self.checkpoint.id, clock.now()) if exiting else clock.stamp(step),
        )
        if self.saver is not None and (exiting or self.durable):
            changed = new_versions(self._saved_versions, self.checkpoint.channel_versions)
            self._saved_versions = dict(self.checkpoint.channel_versions)
            saved_parent = self._saved_config["configurable"].get(CHECKPOINT_ID)
            self.parent_config = self._saved_config if saved_parent else None
            stored = self._stored_checkpoint(channels, changed)
            self.config = self._put_step(stored, changed, defer=defer, soon=soon)
            self._saved_config = dict(self.config)
            self._saved_id = self.checkpoint.id
        elif not exiting:
            # Not stored (yet): under durability="exit" its parent is the saver's head, the
            # checkpoint it will hang from when the run stores it.
            saved_parent = self._saved_config["configurable"].get(CHECKPOINT_ID)
            if self.saver is None:
                self.parent_config = self.config
            else:
                self.parent_config = self._saved_config if saved_parent else None
            self.config = {
                "configurable": {**self.config["configurable"], CHECKPOINT_ID: self.checkpoint.id}
            }

    def record(
        self, task_id: str, task_path: str, writes: Sequence[Write], node: str
    ) -> list[Write]:
        """Add a task's writes to the pending writes, and store them when durable.

        A value may be ``Encoded`` (a worker's bytes): the saver stores those bytes as they
        are; the pending writes, and the writes returned, hold the decoded value.

        Raises:
            SerializationError: a value the saver cannot store, naming ``node`` and the channel;
                a worker's value this process cannot decode (a type whose module only the
                worker imported), noted with ``node`` and the task.
        """
        try:
            with collector.paused(len(writes)):  # a node that returned thousands of Sends
                plain = [(c, decoded(v)) for c, v in writes]
        except SerializationError as exc:
            exc.add_note(f"During task with name '{node}' and id '{task_id}' (its writes)")
            raise
        self.pending.add(task_id, plain)
        if not self.durable or not self.config["configurable"].get(CHECKPOINT_ID):
            # Without a checkpoint yet (a Command input on a new thread) there is nothing to
            # record the writes against: they stay in memory, as without a saver.
            return plain
        for chan, value in writes:  # their bytes may become the channel's blob
            if isinstance(value, Encoded):
                self._write_bytes.setdefault(chan, []).append(value)
        if self._batch is not None:
            self._batch.append((task_id, task_path, writes, node, plain))
        else:
            self._put_writes(task_id, task_path, writes, node, plain)
        return plain

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Gather the writes ``record`` takes in the block, stored together: when the block
        ends, with those of earlier blocks kept back, once ``STORE_AT`` tasks' writes wait or
        the first of them has waited ``STORE_WITHIN`` seconds. ``hold()`` in the block keeps
        them all for the step's checkpoint instead; ``store_by`` says when the kept ones are
        due, for a loop that waits on its tasks meanwhile.

        Raises:
            SerializationError: a value the saver cannot store, naming its node and channel.
        """
        self._batch, self._hold = [], False
        try:
            yield
        finally:  # what was recorded is stored or kept, even when the block failed
            batch, self._batch = self._batch, None
            if batch and not self._held:
                self._kept_since = time.monotonic()
            self._held.extend(batch)
            if batch and not self._hold:
                due = self.store_by
                if len(self._held) >= STORE_AT or (due is not None and time.monotonic() >= due):
                    self.flush()

    @property
    def store_by(self) -> float | None:
        """When the writes ``batched`` kept back are due to be stored (monotonic; None: none
        are kept). Past it, ``flush()`` stores them."""
        if not self._held or self._hold:
            return None
        return self._kept_since + STORE_WITHIN

    def hold(self) -> None:
        """The step's last results are in (``batched`` block): store their writes, and any
        kept back, with the step's checkpoint, in one transaction (``put_step``), not before
        it. Whatever stops the step first must ``flush()`` them."""
        self._hold = self._batch is not None

    def flush(self) -> None:
        """Store the writes held for a checkpoint that will not be made (the run stopped).

        Raises:
            SerializationError: a value the saver cannot store, naming its node and channel.
        """
        self.store_deferred()
        held, self._held, self._hold = self._held, [], False
        if held:
            self._put_batch(held)

    def store_deferred(self) -> None:
        """Store the checkpoint ``commit(defer=True)`` held back, on its own, and confirm the
        one committed ``soon``: before the writes recorded against it, or before a task
        that runs user code starts from it.

        Raises:
            LeaseLostError: the confirmed commit's thread moved to another coordinator.
        """
        self.confirm()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            assert self.saver is not None  # only a saver's commit defers
            put_steps(self.saver, [deferred])

    def confirm(self) -> None:
        """Confirm the checkpoint committed ``soon``, if it is still on its way.

        Raises:
            LeaseLostError: its thread moved to another coordinator (nothing is stored).
        """
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight()  # (what waits for it keeps waiting when it raises: nothing is lost)
            when_stored, self._when_stored = self._when_stored, []
            for call in when_stored:
                call()

    def when_stored(self, call: Callable[[], None]) -> None:
        """``call()`` once the last checkpoint committed is stored: now, or when its commit
        sent ``soon`` is confirmed (never, if that fails)."""
        if self._in_flight is None:
            call()
        else:
            self._when_stored.append(call)

    def _put_step(
        self,
        stored: Checkpoint,
        changed: Mapping[str, Any],
        *,
        defer: bool = False,
        soon: bool = False,
    ) -> dict[str, Any]:
        """Store the held writes and ``stored`` after them, together when the saver can;
        after a deferred checkpoint, in the same transaction. ``defer``: hold ``stored``
        back instead, where the saver can store it with the next (its config, as stored).
        ``soon``: send it, confirmed later (``commit``)."""
        assert self.saver is not None
        self.confirm()  # one commit in flight at a time, confirmed in order
        if self._held and self.config != self._saved_config:
            self.flush()  # (held against another checkpoint than the parent: not one step)
        if defer and stores_steps_together(self.saver) and not self._held:
            self.store_deferred()  # at most one waits
            self._deferred = (dict(self._saved_config), [], stored, dict(self.metadata), changed)
            thread_id, ns, _ = config_thread(self._saved_config)
            return checkpoint_config(thread_id, ns, stored.id)
        held = [(w, t, p) for t, p, w, _, _ in self._held]
        step = (self._saved_config, held, stored, self.metadata, changed)
        deferred, self._deferred = self._deferred, None
        steps = [step] if deferred is None else [deferred, step]
        try:
            if soon:
                configs, self._in_flight = put_steps_soon(self.saver, steps)
            else:
                configs = put_steps(self.saver, steps)
            config = configs[-1]
        except SerializationError:
            if not held:
                raise
            if deferred is not None:
                put_steps(self.saver, [deferred])
            self.flush()  # raises naming the write's node and channel if a write is at fault
            config = self.saver.put(self._saved_config, stored, self.metadata, changed)
        self._held, self._hold = [], False
        return config

    def _put_batch(self, batch: list[_Recorded]) -> None:
        assert self.saver is not None
        self.store_deferred()
        try:
            put_writes_batch(self.saver, self.config, [(w, t, p) for t, p, w, _, _ in batch])
        except SerializationError:
            for task_id, task_path, writes, node, plain in batch:  # (raises naming the value)
                self._put_writes(task_id, task_path, writes, node, plain)
            raise

    def record_input(self, writes: Sequence[Write]) -> None:
        """Record a ``Command``'s writes as the run's input (``NULL_TASK_ID``) writes.

        Unlike a task's, they add to the input writes already pending: a second
        ``Command(resume=…, update=…)`` on the same checkpoint keeps the first one's update.
        Savers key a write by its position and keep the first write at each, so the earlier
        regular writes are handed over again first (kept once), then the new ones, special
        channels last (a special row is replaced, not positioned).
        """
        earlier = [(c, v) for t, c, v in self.pending if t == NULL_TASK_ID and c not in SPECIAL]
        new = sorted(writes, key=lambda w: w[0] in SPECIAL)
        self.pending.add(NULL_TASK_ID, [(c, decoded(v)) for c, v in new])
        if self.durable and self.config["configurable"].get(CHECKPOINT_ID):
            self._put_writes(NULL_TASK_ID, "", [*earlier, *new], "input", new)

    def with_bytes(self, chan: str, value: Any, version: Any) -> Any:
        """``value``, or the ``Encoded`` stored for it when the channel has not changed since."""
        known = self._channel_bytes.get(chan)
        if known is None or known[0] != version:
            return value
        return known[1] if known[1].holds(value) else value

    def _stored_checkpoint(
        self, channels: Mapping[str, BaseChannel[Any, Any]], changed: Mapping[str, Any]
    ) -> Checkpoint:
        """The checkpoint as the saver gets it: each changed channel's value encoded once.

        A ``LastValue`` channel holding a write of this step stores that write's bytes (a
        worker's, never decoded and encoded again); any other changed value (a reducer's
        result) is encoded here, once per new version. Both are kept for the next step.
        """
        assert self.saver is not None
        serde = self.saver.serde
        written, self._write_bytes = self._write_bytes, {}
        values = dict(self.checkpoint.channel_values)
        for chan in changed:
            before = self._stored_items.pop(chan, None)
            if chan not in values:
                continue
            value = values[chan]
            version = self.checkpoint.channel_versions.get(chan)
            if type(value) is list and isinstance(version, int):
                self._stored_items[chan] = (version, tuple(value))
            items = appended(before[1], value) if before is not None else None
            data = delta(serde, before[0], items) if before is not None and items else None
            if data is not None:  # only the new items: the next step ships the whole value
                values[chan] = Encoded(data, serde, value)
                self._channel_bytes.pop(chan, None)
                continue
            found = None
            if isinstance(channels.get(chan), LastValue):
                found = next((e for e in written.get(chan, ()) if e.holds(value)), None)
            encoded = found if found is not None else Encoded.of(serde, value)
            values[chan] = encoded
            self._channel_bytes[chan] = (version, encoded)
        return dataclasses.replace(self.checkpoint, channel_values=values)

    def store_at_exit(self, paths: Mapping[str, str]) -> None:
        """Store every pending write of a ``durability="exit"`` run (``paths``: by task id).

        A resumed run's rows loaded from the saver are stored already: storing them again
        at other slots would store them twice (savers key a regular write by its position).
        """
        by_task: dict[str, list[Write]] = {}
        for tid, chan, value in self.pending.unstored():
            by_task.setdefault(tid, []).append((chan, value))
        assert self.saver is not None
        batch = [(writes, tid, paths.get(tid, "")) for tid, writes in by_task.items()]
        put_writes_batch(self.saver, self.config, batch)

    def _put_writes(
        self,
        task_id: str,
        task_path: str,
        writes: Sequence[Write],
        node: str,
        plain: Sequence[Write],
    ) -> None:
        assert self.saver is not None
        self.store_deferred()
        try:
            self.saver.put_writes(self.config, writes, task_id, task_path)
        except SerializationError as exc:
            for chan, value in plain:  # raises naming the first channel that cannot be stored
                dumps_for(self.saver.serde, value, node=node, channel=chan)
            raise SerializationError(f"node '{node}': {exc}") from exc
