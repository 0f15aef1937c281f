"""Deterministic ids: tasks and interrupts (checkpoint ids are minted by ``coordinator.clock``).

A task id is a pure function of (checkpoint id, namespace, step, node, trigger path or Send
index), so a re-planned step yields the same ids in any process, and a result delivered
twice lands on the same key. bulksync hashes with BLAKE2b (stdlib) where LangGraph uses
xxh3; ids are opaque, only their determinism matters.
"""

from __future__ import annotations

import hashlib


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
