"""Group commit: what callers send while one round trip is on the wire rides the next one.

A database groups the commits that wait on one log flush; :class:`Rounds` does the same for
any round trip a process makes on behalf of many callers (a coordinator's runs). The first
caller sends at once, alone. Callers that arrive while it is on the wire wait; when it
returns, one of them sends everything that waited (at most ``most`` entries: the longest
waiting, and its own), and the rest wait for the round after. Nothing waits for company:
a lone caller pays nothing more than before, and under load the round trips are shared.

The ``send`` function given to :meth:`Rounds.join` settles each entry of its batch (its reply
or its error, on the entry itself); what it raises reaches only the caller that ran it, so it
must have settled every entry first. Used by the coordinator's dispatch (``outbox.py``) and
by ``PostgresSaver``'s checkpoint commits.

This module sits at the bottom of the layers, beside ``retry.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

E = TypeVar("E")


class _Slot(Generic[E]):
    __slots__ = ("entry", "done", "woken")

    def __init__(self, entry: E) -> None:
        self.entry = entry
        self.done = False
        self.woken: threading.Condition | None = None  # made once its caller has to wait


class Rounds(Generic[E]):
    """Sends the entries of concurrent callers in shared rounds (module docstring).

    A round's end wakes only the callers it settled, and the longest waiting of the others
    (to send the next round): not every waiting thread, which under load would each take
    the GIL to find it must wait on.
    """

    def __init__(self, most: int | None = None) -> None:
        if most is not None and most < 1:
            raise ValueError(f"Rounds(most={most}): a round holds at least one entry")
        self._most = most
        self._lock = threading.Lock()
        self._waiting: list[_Slot[E]] = []
        self._busy = False

    @property
    def waiting(self) -> int:
        """How many entries wait for the next round."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        """Whether a round is being sent."""
        return self._busy

    def take(self) -> bool:
        """Hold the rounds for a send of the caller's own, when none is being sent and none
        waits (False: busy). Callers that join meanwhile wait; ``give_back`` lets them go."""
        with self._lock:
            if self._busy or self._waiting:
                return False
            self._busy = True
            return True

    def give_back(self) -> None:
        """End the send ``take`` held the rounds for: the longest waiting caller sends the
        next round, with everything that waited."""
        with self._lock:
            self._busy = False
            if self._waiting and self._waiting[0].woken is not None:
                self._waiting[0].woken.notify()

    def join(self, entry: E, send: Callable[[list[E]], None]) -> None:
        """Return once a round holding ``entry`` was sent: by another caller, or by this one
        (``send`` called with the entries that waited longest, this one among them)."""
        slot = _Slot(entry)
        with self._lock:
            self._waiting.append(slot)
            while self._busy and not slot.done:
                if slot.woken is None:
                    slot.woken = threading.Condition(self._lock)
                slot.woken.wait()
            if slot.done:
                return
            self._busy = True
            waiting = self._waiting
            if self._most is None or len(waiting) <= self._most:
                batch, self._waiting = waiting, []
            else:  # the longest waiting, and this one
                older = [s for s in waiting[: self._most] if s is not slot]
                batch = [*older[: self._most - 1], slot]
                self._waiting = [s for s in waiting if s not in batch]
        try:
            send([s.entry for s in batch])
        finally:
            with self._lock:
                for s in batch:
                    s.done = True
                    if s.woken is not None:
                        s.woken.notify()
                self._busy = False
                # Every slot still waiting has its caller asleep on its own condition.
                if self._waiting and self._waiting[0].woken is not None:
                    self._waiting[0].woken.notify()
