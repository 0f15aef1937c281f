"""Savers: where threads' checkpoints and pending writes are kept, and how values are encoded.

The names below are loaded on first use (PEP 562), so code that needs only the records of
``checkpoint.base`` (the pure core) does not load msgpack, the savers or SQLite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulksync.exports import lazy_exports

if TYPE_CHECKING:
    from bulksync.checkpoint.base import (
        Checkpoint,
        CheckpointSaver,
        CheckpointTuple,
        PendingWrite,
        Serde,
    )
    from bulksync.checkpoint.memory import InMemorySaver, MemorySaver
    from bulksync.checkpoint.serde import MsgpackSerde, dumps_for, register_type
    from bulksync.checkpoint.sqlite import SqliteSaver

__all__ = [
    "Checkpoint",
    "CheckpointSaver",
    "CheckpointTuple",
    "InMemorySaver",
    "MemorySaver",
    "MsgpackSerde",
    "PendingWrite",
    "Serde",
    "SqliteSaver",
    "dumps_for",
    "register_type",
]

_HOMES = {
    "Checkpoint": "bulksync.checkpoint.base",
    "CheckpointSaver": "bulksync.checkpoint.base",
    "CheckpointTuple": "bulksync.checkpoint.base",
    "PendingWrite": "bulksync.checkpoint.base",
    "Serde": "bulksync.checkpoint.base",
    "InMemorySaver": "bulksync.checkpoint.memory",
    "MemorySaver": "bulksync.checkpoint.memory",
    "MsgpackSerde": "bulksync.checkpoint.serde",
    "dumps_for": "bulksync.checkpoint.serde",
    "register_type": "bulksync.checkpoint.serde",
    "SqliteSaver": "bulksync.checkpoint.sqlite",
}
"""The module each name of ``__all__`` is loaded from."""


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
