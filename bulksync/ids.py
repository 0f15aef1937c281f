"""Deterministic ids: tasks, interrupts and time-ordered checkpoints.

A task id is a pure function of (checkpoint id, namespace, step, node, trigger path or Send
index), so a re-planned step yields the same ids in any process, and a result delivered
twice lands on the same key. bulksync hashes with BLAKE2b (stdlib) where LangGraph uses
xxh3; ids are opaque, only their determinism matters.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ts = 0


def _as_uuid_str(digest: bytes) -> str:
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def task_id(checkpoint_id: str, *parts: str) -> str:
    """Hash the checkpoint id and ``parts`` (joined without separators, as LangGraph does)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(bytes.fromhex(checkpoint_id.replace("-", "")))
    for part in parts:
        h.update(part.encode())
    return _as_uuid_str(h.digest())


def interrupt_id(task_ns: str, answered: int) -> str:
    """Id of a task's interrupt, keyed by how many answers the task already has."""
    key = f"{task_ns}|{answered}" if answered else task_ns
    return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def checkpoint_id(step: int) -> str:
    """A new checkpoint id: a UUIDv6 whose order is the order of creation.

    The 60-bit timestamp (100 ns units) is forced to increase within this process, so ids
    made in a tight loop still sort in creation order; ``step`` fills the clock sequence.
    """
    global _last_ts
    with _lock:
        ts = time.time_ns() // 100 + 0x01B21DD213814000
        ts = max(ts, _last_ts + 1)
        _last_ts = ts
    time_high = (ts >> 28) & 0xFFFFFFFF
    time_mid = (ts >> 12) & 0xFFFF
    time_low = ts & 0x0FFF
    clock_seq = step & 0x3FFF
    node = int.from_bytes(os.urandom(6), "big")
    value = (
        (time_high << 96)
        | (time_mid << 80)
        | (0x6 << 76)
        | (time_low << 64)
        | ((0x8000 | clock_seq) << 48)
        | node
    )
    return str(uuid.UUID(int=value))
