"""The saver contract: what the superstep loop stores, and how it reads it back.

A saver keeps, per thread and checkpoint namespace, a chain of checkpoints (each naming its
parent) and, per checkpoint, the pending writes of the tasks planned from it. Writes are
keyed by ``(task_id, idx)``: a regular write takes its position in the task's write list and
the first one stored wins (a task delivered twice is recorded once); special writes
(``__error__``, ``__interrupt__``, ``__resume__``) take fixed negative slots and the latest
one replaces the earlier.

Values are encoded with the saver's ``serde`` (msgpack, see ``serde.py``) even in memory,
so a value that could not be stored fails the same way on every saver. A value handed to
``put`` (a channel value) or ``put_writes`` may arrive already encoded, as an ``Encoded``: a
saver stores its bytes as they are when they are in its serde's format (``stored_bytes``), so
a write a worker encoded is not decoded and encoded again on its way to storage. What a saver
reads back is always plain values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, THREAD_ID, WRITES_IDX_MAP
from bulksync.errors import ConfigError

PendingWrite = tuple[str, str, Any]
"""``(task_id, channel, value)`` as recorded for a checkpoint."""

TaskWrites = tuple[Sequence[tuple[str, Any]], str, str]
"""``(writes, task_id, task_path)``: one task's ``put_writes`` arguments."""


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """The state of a thread between two supersteps.

    ``channel_versions`` are integers that only grow; ``versions_seen[node]`` records the
    versions of its trigger channels a node last ran on (``__interrupt__`` is the
    breakpoint's own record). ``updated_channels`` lists the channels the last step changed.
    """

    v: int
    id: str
    ts: str
    channel_values: Mapping[str, Any]
    channel_versions: Mapping[str, int]
    versions_seen: Mapping[str, Mapping[str, int]]
    updated_channels: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointTuple:
    """A stored checkpoint with its config, metadata, parent and pending writes."""

    config: dict[str, Any]
    checkpoint: Checkpoint
    metadata: dict[str, Any]
    parent_config: dict[str, Any] | None = None
    pending_writes: tuple[PendingWrite, ...] = ()


@runtime_checkable
class Serde(Protocol):
    """Turns values into bytes and back (``bulksync.checkpoint.serde.MsgpackSerde``)."""

    def dumps(self, value: Any) -> bytes:
        """Encode ``value``.

        Raises:
            SerializationError: naming the type that cannot be encoded.
        """

    def loads(self, data: bytes) -> Any:
        """Decode bytes made by ``dumps``."""


_UNDECODED: Any = object()


class Encoded:
    """A value and the bytes a serde made of it; the value is decoded on first use, once.

    Equal to any ``Encoded`` or plain value its value equals, so it stands in for the value
    wherever values are compared. Made by a worker for each write (``wire.loads_result``),
    or by the loop for a channel value it stores.
    """

    __slots__ = ("_value", "data", "serde")

    def __init__(self, data: bytes, serde: Serde, value: Any = _UNDECODED) -> None:
        self.data = data
        self.serde = serde
        self._value = value

    @classmethod
    def of(cls, serde: Serde, value: Any) -> Encoded:
        """``value`` encoded with ``serde`` now (raises ``SerializationError`` as it does)."""
        return cls(serde.dumps(value), serde, value)

    @property
    def value(self) -> Any:
        """The decoded value (decoded by the first caller, then kept)."""
        if self._value is _UNDECODED:
            self._value = self.serde.loads(self.data)
        return self._value

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is this record's decoded value itself (identity, no decoding)."""
        return self._value is value

    def bytes_for(self, serde: Serde) -> bytes | None:
        """``data`` if ``serde`` reads and writes the same bytes (same serde, or the same
        declared ``format``), else ``None``: the value must be encoded for ``serde``."""
        if serde is self.serde:
            return self.data
        mine = getattr(self.serde, "format", None)
        return self.data if mine is not None and mine == getattr(serde, "format", None) else None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Encoded):
            other = other.value
        return bool(self.value == other)

    __hash__ = None  # type: ignore[assignment]  # equal to unhashable values too

    def __repr__(self) -> str:
        shown = "…" if self._value is _UNDECODED else repr(self._value)
        return f"Encoded({shown}, {len(self.data)} bytes)"


def decoded(value: Any) -> Any:
    """The plain value of ``value`` (an ``Encoded`` decoded, anything else as is)."""
    return value.value if isinstance(value, Encoded) else value


def stored_bytes(serde: Serde, value: Any) -> bytes:
    """The bytes a saver stores for ``value``: an ``Encoded`` value's own bytes when they are
    in ``serde``'s format, else ``serde.dumps`` of the plain value.

    Raises:
        SerializationError: the plain value cannot be encoded.
    """
    if isinstance(value, Encoded):
        data = value.bytes_for(serde)
        return data if data is not None else serde.dumps(value.value)
    return serde.dumps(value)


@runtime_checkable
class CheckpointSaver(Protocol):
    """Stores checkpoints and pending writes; ``memory``, ``sqlite`` and ``postgres``."""

    serde: Serde

    def get_tuple(self, config: Mapping[str, Any]) -> CheckpointTuple | None:
        """The checkpoint named by ``configurable.checkpoint_id``, else the thread's latest."""

    def list(
        self,
        config: Mapping[str, Any] | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first; ``filter`` matches metadata keys, ``before`` a checkpoint id.

        ``config`` names the thread and optionally a namespace (without one, as in LangGraph:
        every namespace of the thread, its subgraphs' too); ``None`` lists every thread.
        """

    def put(
        self,
        config: Mapping[str, Any],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """Store ``checkpoint`` as the child of ``config``'s checkpoint; return its config.

        ``new_versions`` names the channels whose value changed since the parent: only those
        need their value stored again. A channel value may be an ``Encoded`` (stored with
        ``stored_bytes``).
        """

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes against ``config``'s checkpoint (see the module docstring).

        A value may be an ``Encoded`` (stored with ``stored_bytes``).
        """

    def delete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint and write of ``thread_id``, in every namespace."""


class LeasingSaver(CheckpointSaver, Protocol):
    """A saver that also leases threads, so that one coordinator at a time writes each.

    A lease carries a fencing token that grows on every handover; a ``fenced`` view's
    commits check it, so a coordinator that lost its lease can never fork the chain.
    """

    def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> int | None:
        """Hold ``thread_id`` for ``ttl`` seconds; its fencing token, or None if taken."""

    def renew_leases(self, owner: str, leases: Mapping[str, int], ttl: float) -> set[str]:
        """Extend ``owner``'s leases (a token by thread id) at once; the threads renewed,
        without those whose lease no longer carries the token."""

    def release_lease(self, thread_id: str, owner: str, token: int) -> None:
        """End the lease now if ``owner`` still holds it with ``token``."""

    def fenced(self, thread_id: str, token: int, *, empty: bool = False) -> CheckpointSaver:
        """This saver, whose commits to ``thread_id`` fail once the lease has another token
        (``empty``: the thread had no root checkpoint when the lease was taken)."""


def put_writes_batch(
    saver: CheckpointSaver, config: Mapping[str, Any], batch: Sequence[TaskWrites]
) -> None:
    """Record several tasks' writes against ``config``'s checkpoint: in one round trip when
    the saver can (``PostgresSaver.put_writes_batch``), else task by task."""
    batched = getattr(saver, "put_writes_batch", None)
    if batched is not None:
        batched(config, batch)
        return
    for writes, task_id, task_path in batch:
        saver.put_writes(config, writes, task_id, task_path)


Step = tuple[
    Mapping[str, Any], Sequence[TaskWrites], Checkpoint, Mapping[str, Any], Mapping[str, int]
]
"""One ``put_step``'s arguments: the parent's config, the writes recorded against the parent,
the checkpoint, its metadata and its new versions."""


def put_step(
    saver: CheckpointSaver,
    config: Mapping[str, Any],
    batch: Sequence[TaskWrites],
    checkpoint: Checkpoint,
    metadata: Mapping[str, Any],
    new_versions: Mapping[str, int],
) -> dict[str, Any]:
    """Record ``batch`` against ``config``'s checkpoint, then store ``checkpoint`` as its
    child; its config. One transaction when the saver can (``PostgresSaver.put_step``)."""
    together = getattr(saver, "put_step", None)
    if together is not None:
        return dict(together(config, batch, checkpoint, metadata, new_versions))
    if batch:
        put_writes_batch(saver, config, batch)
    return saver.put(config, checkpoint, metadata, new_versions)


def put_steps(saver: CheckpointSaver, steps: Sequence[Step]) -> list[dict[str, Any]]:
    """``put_step`` of each of ``steps`` in order; their configs. One transaction when the
    saver can (``PostgresSaver.put_steps``: see ``stores_steps_together``)."""
    together = getattr(saver, "put_steps", None)
    if together is not None:
        return [dict(c) for c in together(steps)]
    return [put_step(saver, *step) for step in steps]


def put_steps_soon(
    saver: CheckpointSaver, steps: Sequence[Step]
) -> tuple[list[dict[str, Any]], Callable[[], None] | None]:
    """``put_steps`` of ``steps``, sent now where the saver can (``PostgresSaver.
    put_steps_soon``) and confirmed by the callable returned; None when it is confirmed
    already."""
    soon = getattr(saver, "put_steps_soon", None)
    if soon is None:
        return put_steps(saver, steps), None
    configs, confirm = soon(steps)
    return [dict(c) for c in configs], confirm


def stores_steps_together(saver: CheckpointSaver) -> bool:
    """Whether ``put_steps`` stores several checkpoints in one transaction on ``saver``."""
    return hasattr(saver, "put_steps")


def write_index(channel: str, position: int) -> int:
    """The slot of a write: fixed for special channels, else its position in the task's list."""
    return WRITES_IDX_MAP.get(channel, position)


def writes_sort_key(task_path: str, task_id: str, idx: int) -> tuple[str, str, int]:
    """Pending writes are returned in this order (task path, then id, then slot)."""
    return (task_path, task_id, idx)


def checkpoint_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> dict[str, Any]:
    """The config that names one checkpoint."""
    return {
        "configurable": {
            THREAD_ID: thread_id,
            CHECKPOINT_NS: checkpoint_ns,
            CHECKPOINT_ID: checkpoint_id,
        }
    }


def config_thread(config: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """``(thread_id, checkpoint_ns, checkpoint_id or None)`` from a config.

    Raises:
        ValueError: when ``configurable.thread_id`` is missing.
    """
    conf = config.get("configurable") or {}
    if conf.get(THREAD_ID) is None:
        # LangGraph raises a bare ValueError for a checkpointed run without a thread.
        raise ValueError(
            "A checkpointer needs a thread: pass config={'configurable': {'thread_id': ...}}."
        )
    return str(conf[THREAD_ID]), str(conf.get(CHECKPOINT_NS) or ""), conf.get(CHECKPOINT_ID)


def write_target(config: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(thread, ns, checkpoint id)`` that ``put_writes`` records against.

    Raises:
        ConfigError: when the config names no checkpoint (a ``ValueError``).
    """
    thread_id, ns, checkpoint_id = config_thread(config)
    if checkpoint_id is None:
        raise ConfigError(
            "put_writes needs the checkpoint the task was planned from: pass the config "
            "returned by put() (it has configurable.checkpoint_id)."
        )
    return thread_id, ns, checkpoint_id


def blob_rows(
    serde: Serde,
    thread_id: str,
    ns: str,
    checkpoint: Checkpoint,
    new_versions: Mapping[str, int],
) -> list[tuple[str, str, str, int, bytes | None]]:
    """``(thread, ns, channel, version, bytes)`` for each channel in ``new_versions``.

    Sorted by channel, so concurrent puts lock rows in one order; ``None`` bytes: the channel
    is empty at that version.
    """
    values = checkpoint.channel_values
    return [
        (thread_id, ns, ch, version, stored_bytes(serde, values[ch]) if ch in values else None)
        for ch, version in sorted(new_versions.items())
    ]


def write_rows(
    serde: Serde,
    config: Mapping[str, Any],
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> list[tuple[str, str, str, str, int, str, bytes, str]]:
    """``(thread, ns, checkpoint id, task id, idx, channel, bytes, task path)`` per write.

    Sorted by slot (``idx``, at position 4; stable, so a repeated special slot still ends
    with its last value): concurrent deliveries of one task lock rows in the same order.

    Raises:
        ConfigError: when the config names no checkpoint (see ``write_target``).
    """
    thread_id, ns, checkpoint_id = write_target(config)
    rows = [
        (
            thread_id,
            ns,
            checkpoint_id,
            task_id,
            write_index(ch, pos),
            ch,
            stored_bytes(serde, v),
            task_path,
        )
        for pos, (ch, v) in enumerate(writes)
    ]
    rows.sort(key=lambda r: r[4])
    return rows


def before_id(before: Mapping[str, Any] | None) -> str | None:
    """The checkpoint id ``list(before=...)`` names (its thread is not needed)."""
    if before is None:
        return None
    checkpoint_id = (before.get("configurable") or {}).get(CHECKPOINT_ID)
    return None if checkpoint_id is None else str(checkpoint_id)


def names_namespace(config: Mapping[str, Any]) -> bool:
    """Whether a ``list`` config names a namespace: without one, as in LangGraph's savers,
    the thread's checkpoints of every namespace (its subgraphs' too) are listed."""
    return (config.get("configurable") or {}).get(CHECKPOINT_NS) is not None


def list_where(
    config: Mapping[str, Any] | None,
    before: Mapping[str, Any] | None,
    placeholder: str,
    *,
    listing: bool = False,
) -> tuple[str, list[Any]]:
    """The SQL ``WHERE`` clause (and its parameters) selecting checkpoints for ``list``'s
    config and ``before`` arguments (``listing``), or ``get_tuple``'s config (namespace
    ``""`` unless named); ``placeholder`` is the driver's parameter marker (``%s`` for
    psycopg, ``?`` for sqlite3)."""
    where = "1 = 1"
    params: list[Any] = []
    if config is not None:
        thread_id, ns, checkpoint_id = config_thread(config)
        where += f" AND thread_id = {placeholder}"
        params.append(thread_id)
        if not listing or names_namespace(config):
            where += f" AND checkpoint_ns = {placeholder}"
            params.append(ns)
        if checkpoint_id is not None:
            where += f" AND checkpoint_id = {placeholder}"
            params.append(checkpoint_id)
    before_checkpoint = before_id(before)
    if before_checkpoint is not None:
        where += f" AND checkpoint_id < {placeholder}"
        params.append(before_checkpoint)
    return where, params


def metadata_matches(metadata: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether every key of ``filter`` has the same value in ``metadata``."""
    return not filter or all(metadata.get(k) == v for k, v in filter.items())


def keyset_pages(
    read_page: Callable[[int, list[Any]], Sequence[CheckpointTuple]],
    *,
    filter: Mapping[str, Any] | None,
    exact: bool,
    limit: int | None,
    page_size: int,
) -> Iterator[CheckpointTuple]:
    """A SQL saver's ``list``: checkpoints newest first, read one page query at a time.

    ``read_page(size, after)`` returns up to ``size`` rows ordered by (checkpoint id, thread,
    namespace) descending, strictly after the key ``after`` (``[]``: from the start). Each
    page is a fresh query, so no cursor stays open across yields. ``exact`` says the query
    already applied ``filter``; otherwise rows are matched here.
    """
    left, after = limit, list[Any]()
    while left is None or left > 0:
        size = min(left, page_size) if exact and left is not None else page_size
        page = read_page(size, after)
        for item in page:
            if exact or metadata_matches(item.metadata, filter):
                yield item
                left = None if left is None else left - 1
                if left == 0:
                    return
        if len(page) < size:
            return
        conf = page[-1].config["configurable"]
        after = [conf[CHECKPOINT_ID], conf[THREAD_ID], conf[CHECKPOINT_NS]]
