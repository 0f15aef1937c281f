"""The saver contract: what the superstep loop stores, and how it reads it back.

A saver keeps, per thread and checkpoint namespace, a chain of checkpoints (each naming its
parent) and, per checkpoint, the pending writes of the tasks planned from it. Writes are
keyed by ``(task_id, idx)``: a regular write takes its position in the task's write list and
the first one stored wins (a task delivered twice is recorded once); special writes
(``__error__``, ``__interrupt__``, ``__resume__``) take fixed negative slots and the latest
one replaces the earlier.

Values are encoded with the saver's ``serde`` (msgpack, see ``serde.py``) even in memory,
so a value that could not be stored fails the same way on every saver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, THREAD_ID, WRITES_IDX_MAP

PendingWrite = tuple[str, str, Any]
"""``(task_id, channel, value)`` as recorded for a checkpoint."""


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

        ``config`` names the thread (and namespace, default ``""``); ``None`` lists every thread.
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
        need their value stored again.
        """

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes against ``config``'s checkpoint (see the module docstring)."""

    def delete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint and write of ``thread_id``, in every namespace."""


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
        raise ValueError(
            "A checkpointer needs a thread: pass config={'configurable': {'thread_id': ...}}."
        )
    return str(conf[THREAD_ID]), str(conf.get(CHECKPOINT_NS) or ""), conf.get(CHECKPOINT_ID)


def write_target(config: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(thread, ns, checkpoint id)`` that ``put_writes`` records against.

    Raises:
        ValueError: when the config names no checkpoint.
    """
    thread_id, ns, checkpoint_id = config_thread(config)
    if checkpoint_id is None:
        raise ValueError(
            "put_writes needs the checkpoint the task was planned from: pass the config "
            "returned by put() (it has configurable.checkpoint_id)."
        )
    return thread_id, ns, checkpoint_id


def before_id(before: Mapping[str, Any] | None) -> str | None:
    """The checkpoint id ``list(before=...)`` names (its thread is not needed)."""
    if before is None:
        return None
    checkpoint_id = (before.get("configurable") or {}).get(CHECKPOINT_ID)
    return None if checkpoint_id is None else str(checkpoint_id)


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
