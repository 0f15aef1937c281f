"""``InMemorySaver``: the saver contract kept in dictionaries, for tests and notebooks.

Values are still encoded with the serde and metadata as JSON, so what fails to store here fails
on every saver, and what reads back here reads back the same from SQLite or Postgres. Layout,
mirroring the SQL savers' tables::

    checkpoints  (thread, ns) -> {checkpoint id: (record bytes, metadata, parent id, versions)}
    blobs        (thread, ns, channel) -> {version: value bytes, or None for "empty"}
    writes       (thread, ns, checkpoint id) -> {(task id, idx): (channel, bytes, task path)}

One lock guards all three, so the saver may be shared by the executor's threads.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from bulksync.checkpoint.appends import Chains
from bulksync.checkpoint.async_methods import AsyncSaverMethods
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointTuple,
    Serde,
    before_id,
    checkpoint_config,
    config_thread,
    metadata_matches,
    names_namespace,
    stored_bytes,
    write_index,
    write_target,
    writes_sort_key,
)
from bulksync.checkpoint.serde import (
    MsgpackSerde,
    dumps_checkpoint,
    dumps_metadata,
    loads_checkpoint,
    loads_metadata,
)

_Key = tuple[str, str, str]  # (thread id, namespace, checkpoint id)
_Write = tuple[str, bytes, str]  # (channel, value bytes, task path)


class _Stored(NamedTuple):
    """One checkpoint as kept: encoded, plus what lookups need without decoding."""

    data: bytes
    metadata_json: str
    metadata: dict[str, Any]
    parent_id: str | None
    versions: dict[str, int]


class _Raw(NamedTuple):
    """Stored bytes of one checkpoint, copied out under the lock and decoded after."""

    key: _Key
    stored: _Stored
    blobs: dict[str, bytes | None]
    writes: list[tuple[str, str, bytes]]


class InMemorySaver(AsyncSaverMethods):
    """A ``CheckpointSaver`` that keeps everything in this process's memory."""

    def __init__(self, *, serde: Serde | None = None) -> None:
        self.serde: Serde = serde if serde is not None else MsgpackSerde()
        self._lock = threading.Lock()
        self._checkpoints: dict[tuple[str, str], dict[str, _Stored]] = {}
        # (thread, ns, channel) -> version -> value bytes (None: empty at that version)
        self._blobs: dict[tuple[str, str, str], dict[int, bytes | None]] = {}
        self._writes: dict[_Key, dict[tuple[str, int], _Write]] = {}

    def get_tuple(self, config: Mapping[str, Any]) -> CheckpointTuple | None:
        """The checkpoint named by ``configurable.checkpoint_id``, else the thread's latest."""
        thread_id, ns, checkpoint_id = config_thread(config)
        with self._lock:
            stored = self._checkpoints.get((thread_id, ns), {})
            if checkpoint_id is None and stored:
                checkpoint_id = max(stored)
            if checkpoint_id is None or checkpoint_id not in stored:
                return None
            raw = self._snapshot((thread_id, ns, checkpoint_id), stored[checkpoint_id])
        return self._decode(raw)

    def list(
        self,
        config: Mapping[str, Any] | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first; ``filter`` matches metadata keys, ``before`` a checkpoint id.

        ``config`` names the thread, optionally a namespace (without one: all of the
        thread's) and one checkpoint; ``None`` lists every thread and namespace.
        """
        with self._lock:
            keys = self._matching_keys(config, before_id(before))
            raws: builtins.list[_Raw] = []
            for key in keys:
                if limit is not None and len(raws) >= limit:
                    break
                stored = self._checkpoints[key[:2]][key[2]]
                if metadata_matches(stored.metadata, filter):
                    raws.append(self._snapshot(key, stored))
        chains = Chains(self.serde, self._versions)  # one per listing: versions rebuilt once
        for raw in raws:
            yield self._decode(raw, chains)

    def put(
        self,
        config: Mapping[str, Any],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """Store ``checkpoint`` as the child of ``config``'s checkpoint; return its config.

        Only channels in ``new_versions`` get a blob; the others are read from the blob stored
        when their current version was written.
        """
        thread_id, ns, parent_id = config_thread(config)
        blobs = {
            (ch, version): (
                stored_bytes(self.serde, checkpoint.channel_values[ch])
                if ch in checkpoint.channel_values
                else None
            )
            for ch, version in new_versions.items()
        }
        metadata_json = dumps_metadata(metadata)
        record = _Stored(
            data=dumps_checkpoint(self.serde, checkpoint),
            metadata_json=metadata_json,
            metadata=loads_metadata(metadata_json),
            parent_id=parent_id,
            versions=dict(checkpoint.channel_versions),
        )
        with self._lock:
            # A (channel, version) written again replaces the value, as in the SQL savers.
            for (ch, version), blob in blobs.items():
                self._blobs.setdefault((thread_id, ns, ch), {})[version] = blob
            self._checkpoints.setdefault((thread_id, ns), {})[checkpoint.id] = record
        return checkpoint_config(thread_id, ns, checkpoint.id)

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes: regular slots keep the first value, special slots the last."""
        target = write_target(config)
        # Encode everything first so a bad value stores none of the batch.
        encoded = [
            (write_index(channel, pos), channel, stored_bytes(self.serde, value))
            for pos, (channel, value) in enumerate(writes)
        ]
        with self._lock:
            stored = self._writes.setdefault(target, {})
            for idx, channel, blob in encoded:
                if idx >= 0 and (task_id, idx) in stored:
                    continue
                stored[(task_id, idx)] = (channel, blob, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint and write of ``thread_id``, in every namespace."""
        with self._lock:
            for scope in [k for k in self._checkpoints if k[0] == thread_id]:
                del self._checkpoints[scope]
            for blob in [k for k in self._blobs if k[0] == thread_id]:
                del self._blobs[blob]
            for target in [k for k in self._writes if k[0] == thread_id]:
                del self._writes[target]

    def _matching_keys(
        self, config: Mapping[str, Any] | None, before: str | None
    ) -> builtins.list[_Key]:
        """Keys of the checkpoints ``list`` may return, newest first (lock held)."""
        if config is None:
            scopes = list(self._checkpoints)
            only_id = None
        else:
            thread_id, ns, only_id = config_thread(config)
            scopes = [(thread_id, ns)]
            if not names_namespace(config):  # the thread's every namespace
                scopes = [scope for scope in self._checkpoints if scope[0] == thread_id]
        keys = [
            (thread_id, ns, checkpoint_id)
            for thread_id, ns in scopes
            for checkpoint_id in self._checkpoints.get((thread_id, ns), {})
            if (only_id is None or checkpoint_id == only_id)
            and (before is None or checkpoint_id < before)
        ]
        # Same order as the SQL savers: checkpoint id, then thread and namespace, descending.
        keys.sort(key=lambda k: (k[2], k[0], k[1]), reverse=True)
        return keys

    def _snapshot(self, key: _Key, stored: _Stored) -> _Raw:
        """Copy out what ``_decode`` needs (lock held), so decoding runs without the lock."""
        thread_id, ns, _ = key
        blobs = {
            ch: self._blobs.get((thread_id, ns, ch), {}).get(version)
            for ch, version in stored.versions.items()
        }
        slots = self._writes.get(key, {})
        order = sorted(slots, key=lambda slot: writes_sort_key(slots[slot][2], *slot))
        writes = [(slot[0], *slots[slot][:2]) for slot in order]
        return _Raw(key, stored, blobs, writes)

    def _versions(
        self, thread_id: str, ns: str, channel: str, version: int
    ) -> dict[int, bytes | None]:
        """Every stored version of ``channel``: ``version``'s chain among them."""
        with self._lock:
            return dict(self._blobs.get((thread_id, ns, channel), {}))

    def _decode(self, raw: _Raw, chains: Chains | None = None) -> CheckpointTuple:
        thread_id, ns, checkpoint_id = raw.key
        chains = chains or Chains(self.serde, self._versions)
        versions = raw.stored.versions
        values = {
            ch: chains.value(thread_id, ns, ch, versions[ch], b)
            for ch, b in raw.blobs.items()
            if b is not None
        }
        parent_id = raw.stored.parent_id
        return CheckpointTuple(
            config=checkpoint_config(thread_id, ns, checkpoint_id),
            checkpoint=dataclasses.replace(
                loads_checkpoint(self.serde, raw.stored.data), channel_values=values
            ),
            metadata=loads_metadata(raw.stored.metadata_json),
            parent_config=(
                checkpoint_config(thread_id, ns, parent_id) if parent_id is not None else None
            ),
            pending_writes=tuple(
                (task_id, channel, self.serde.loads(blob)) for task_id, channel, blob in raw.writes
            ),
        )


MemorySaver = InMemorySaver
"""LangGraph's older name for ``InMemorySaver``."""
