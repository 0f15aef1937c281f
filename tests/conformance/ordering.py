"""Force the order in which parallel tasks finish, so completion-ordered output is repeatable.

LangGraph streams `updates` (and lists a step's interrupts) in the order tasks finish, while the
state follows task-path order. Scenarios that observe both need a known finishing order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence

WAIT = 1.0
"""Longest a task waits for its predecessor (never reached on a conforming engine)."""

SETTLE = 0.03
"""Pause after the predecessor finished, so the engine has recorded that task's result first."""


class FinishOrder:
    """Tasks named by keys finish in the order given: each waits for the one before it."""

    def __init__(self, order: Sequence[Hashable]) -> None:
        self.order = list(order)
        self.done = {key: threading.Event() for key in self.order}
        self.finished: list[Hashable] = []
        self.timeouts = 0
        self.lock = threading.Lock()

    def wait_turn(self, key: Hashable) -> None:
        """Block until every task ordered before `key` has finished."""
        pos = self.order.index(key)
        if pos == 0:
            return
        if not self.done[self.order[pos - 1]].wait(WAIT):
            self.timeouts += 1
        time.sleep(SETTLE)

    def finish(self, key: Hashable) -> None:
        """Mark `key` finished (call it last thing before the task returns or raises)."""
        with self.lock:
            self.finished.append(key)
        self.done[key].set()

    def run(self, key: Hashable) -> None:
        """Wait for `key`'s turn, then mark it finished."""
        self.wait_turn(key)
        self.finish(key)

    def wait_all(self) -> None:
        """Block until every ordered task finished (for a task that must finish after them)."""
        if not self.done[self.order[-1]].wait(WAIT):
            self.timeouts += 1
        time.sleep(SETTLE)
