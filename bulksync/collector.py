"""Wide steps build their objects with Python's cyclic garbage collector paused.

The collector runs after every 700 net allocations of container objects (tuples, lists,
dicts, instances), every tenth run looks at the middle generation too, and once the objects
that survived grew by a quarter, a *full* collection walks every live object of the process.
A wide step builds tens of thousands of objects on the coordinator that all live on: 10,000
Sends decoded, 10,000 tasks planned and packed, their reports decoded and their writes
applied. None of them is garbage, yet building them set off dozens of collections and two
full ones per 10,000-way fan-out, 40-100 ms each in a process that imported LangGraph, one of
them on the step's critical path, before its tasks were published.

:func:`paused` is for bulksync's own bulk work of that size: the collector is off inside,
and what was built meets the next collection once, as one young generation. Below ``WIDE``
items nothing changes. Threads that pause at once share one pause: the collector is back on
when the last one leaves, and only if it was on when the first came in (a program that turned
it off keeps it off; one that turns it off inside a pause finds it on again after).

Workers do not pause it while they start a message's async tasks: measured, their young
collections then cost more than the full ones saved (``bench/RESULTS.md``).

This module sits at the bottom of the layers, beside ``retry.py``.
"""

from __future__ import annotations

import gc
import threading
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Final

WIDE: Final = 256
"""Items (tasks, writes, reports) from which bulk work pauses the collector."""

_lock = threading.Lock()
_holders = 0  # threads inside a pause now
_resume = False  # whether the collector was on when the pause began


def paused(items: int) -> AbstractContextManager[None]:
    """A context running its block with the collector paused when it handles ``items`` >=
    ``WIDE`` items; below, one shared context that does nothing (some callers enter it once
    per task result: it costs no generator there)."""
    return _Pause() if items >= WIDE else _UNPAUSED


_UNPAUSED: Final = nullcontext()


class _Pause(AbstractContextManager[None]):
    """The collector paused from ``__enter__`` to ``__exit__`` (shared with other threads)."""

    def __enter__(self) -> None:
        _enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _leave()


def _enter() -> None:
    global _holders, _resume
    with _lock:
        if _holders == 0:
            _resume = gc.isenabled()
            gc.disable()
        _holders += 1


def _leave() -> None:
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and _resume:
            gc.enable()
