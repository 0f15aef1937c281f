"""Savers: where threads' checkpoints and pending writes are kept, and how values are encoded."""

from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointSaver,
    CheckpointTuple,
    PendingWrite,
    Serde,
)
from bulksync.checkpoint.memory import InMemorySaver, MemorySaver
from bulksync.checkpoint.serde import MsgpackSerde, StoredError, dumps_for, register_type
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
    "StoredError",
    "dumps_for",
    "register_type",
]
