"""The async twins of a saver's methods (``aget_tuple``, ``alist``, ``aput``, …).

LangGraph's savers offer both; code written for them (``await saver.aget_tuple(config)``,
``async for t in saver.alist(config)``) runs unchanged on bulksync's. Each twin runs the sync
method on a worker thread: a saver call blocks (a lock, SQLite, a Postgres round trip), and
one implementation per method means no behaviour is kept twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bulksync.checkpoint.base import Checkpoint, CheckpointSaver, CheckpointTuple

_DONE = object()


class AsyncSaverMethods:
    """Mixin: a saver's async methods over its sync ones (``self`` is a ``CheckpointSaver``)."""

    async def aget_tuple(
        self: CheckpointSaver, config: Mapping[str, Any]
    ) -> CheckpointTuple | None:
        """``get_tuple`` for async callers."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self: CheckpointSaver,
        config: Mapping[str, Any] | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """``list`` for async callers: each next checkpoint is read on a worker thread."""
        found = self.list(config, filter=filter, before=before, limit=limit)
        while (item := await asyncio.to_thread(next, found, _DONE)) is not _DONE:
            yield item  # type: ignore[misc]

    async def aput(
        self: CheckpointSaver,
        config: Mapping[str, Any],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """``put`` for async callers."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self: CheckpointSaver,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``put_writes`` for async callers."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self: CheckpointSaver, thread_id: str) -> None:
        """``delete_thread`` for async callers."""
        await asyncio.to_thread(self.delete_thread, thread_id)
