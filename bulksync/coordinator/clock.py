"""The loop's clock and randomness: checkpoint ids, timestamps and channel-version bits.

The pure core (``plan``, ``apply``) reads neither the time nor a random source: the loop and
``update_state`` mint what must be fresh here and pass it in (a ``Stamp`` for each new
checkpoint, ``version_bits()`` for each apply), so a step recorded with these values
replays to the same bytes (``tests/unit/coordinator/test_traces.py``).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import uuid
from datetime import UTC, datetime

from bulksync.coordinator.apply import VERSION_RANDOM_BITS, Stamp

_lock = threading.Lock()
_last_ts = 0


def deadline(seconds: float | None) -> float | None:
    """The monotonic time ``seconds`` from now (None: no deadline)."""
    return None if seconds is None else time.monotonic() + seconds


def left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (never below 0; None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def earliest(*deadlines: float | None) -> float | None:
    """The first of ``deadlines`` (None: none of them is set)."""
    return min((d for d in deadlines if d is not None), default=None)


def passed(deadline: float | None) -> bool:
    """Whether ``deadline`` is set and has passed."""
    return deadline is not None and time.monotonic() >= deadline


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


def now() -> str:
    """The current time as a checkpoint's ``ts``: ISO 8601, UTC."""
    return datetime.now(UTC).isoformat()


def stamp(step: int) -> Stamp:
    """A fresh id and the current time for a checkpoint made at ``step``."""
    return Stamp(checkpoint_id(step), now())


def version_bits() -> int:
    """Fresh random low bits for the next channel version, so a fork never reuses one."""
    return secrets.randbits(VERSION_RANDOM_BITS)
