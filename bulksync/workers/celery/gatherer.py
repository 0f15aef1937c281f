"""One gatherer per executor: a thread that takes the reports of every live step from one list.

A step's tasks report to its gatherer's inbox (``keys.inbox``: the step key names it), each
entry addressed to its step (``wire.addressed``). Rather than one thread and one held Redis
connection per waiting step (a thousand runs would need a thousand connections, past any
pool's cap), or one blocking call listing every step's own list (its cost, in the
coordinator and in Redis, grows with the steps in flight), an executor's :class:`Gatherer`
blocks on that one list with ``BLMPOP``, takes up to ``drain_size`` entries at a time, and
hands each step its own, in order. The entries come in the order they were pushed, so no busy
step starves another; a step that joins needs no wake-up: its reports arrive on the list
the thread already blocks on. A Redis before 7.0 has no ``BLMPOP``: there the gatherer takes
one entry with ``BLPOP``, then more with ``LPOP``. Entries for a step that is no longer
gathered (it ended, or another executor's) are dropped.

**Nothing taken is lost.** Entries taken are handed to their steps before anything else is
asked of Redis (with ``BLPOP``, the first entry before the rest is taken; a failure there
leaves the rest in Redis for the next turn). A reply lost with its connection (Redis pops the
entries, the socket drops before they arrive) cannot be taken back, so every ``idle_wait``
seconds the gatherer probes the steps it heard nothing from in that time: a result recorded
in its slot (``keys.result``) whose report was not taken by the time the inbox had been taken
through — every entry it held when the result was seen — is delivered from there (first
result wins, so a duplicate changes nothing), and a step whose keys Redis lost is dispatched
again.

Task deadlines, claim surveys and dropping finished steps look at every step, so they are
done at most every ``CHORES`` seconds rather than after each report, and take at most a
tenth of the thread's time however many steps are in flight. The results of a step whose
checkpoint is committed (``forget``) are deleted then too, off the loop's thread.

Redis errors are logged and retried after ``reconnect_wait`` seconds, for as long as steps
wait: an outage delays a step, it never fails one. The thread ends once no step is left and
none finished for ``LINGER`` seconds, and starts again with the next one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from bulksync import keys
from bulksync.retry import is_transient_redis, is_unknown_command
from bulksync.settings import Settings
from bulksync.workers import wire

log = logging.getLogger(__name__)

CHORES = 0.05
"""Seconds between two looks at every step (task deadlines, claim surveys, finished steps):
a deadline is seen at most this late — or, when so many steps are in flight that a look
takes longer than a tenth of that, nine looks' time late."""


LINGER = CHORES
"""Seconds the thread waits on the inbox after the last step finished, before it ends: a
step dispatched meanwhile (a loop's next step, or the next run's first) needs no new
thread."""


FORGET_BATCH = 1000
"""Keys one ``UNLINK`` deletes, when the results of a wide step are forgotten."""


class Gathered(Protocol):
    """What a gatherer needs of a step in flight (``CeleryStep``)."""

    key: str
    last_seen: float

    def receive(self, entries: Sequence[bytes]) -> None:
        """Handle the step's entries taken from the inbox, in order."""

    def is_open(self) -> bool:
        """Whether some task still owes a result (and the step was not cancelled)."""

    def wait_hint(self) -> float:
        """Seconds until the step's next task deadline (``idle_wait`` when it has none)."""

    def expire(self) -> None:
        """Deliver the tasks whose deadline passed as timed out."""

    def ask_claims(self, pipe: Any) -> bool:
        """Queue on ``pipe`` a look at the step's task claims if one is due (else False)."""

    def heard_claims(self, replies: list[Any]) -> None:
        """Act on the replies to ``ask_claims``: publish lost tasks again, fail poison ones."""

    def probe(self, pipe: Any) -> None:
        """Queue on ``pipe`` the reads that tell whether a quiet step lost something."""

    def settle(self, replies: list[Any], backlog: Backlog) -> None:
        """Act on the replies to ``probe``: deliver stray results, dispatch lost keys again."""

    def drop_keys(self, pipe: Any) -> None:
        """Queue on ``pipe`` the deletion of the finished step's keys."""


@dataclasses.dataclass(frozen=True, slots=True)
class Backlog:
    """Where the gatherer's inbox stood at a probe: ``taken``, how many entries the gatherer
    had taken from it by then; ``through``, the count at which it will have taken every
    entry the inbox held then. A result recorded at the probe and not reported once the
    count reaches ``through`` was taken and lost."""

    taken: int
    through: int

    @property
    def empty(self) -> bool:
        """Whether the inbox held nothing at the probe."""
        return self.through == self.taken


class Gatherer:
    """Gathers the reports of every step an executor has in flight, on one thread."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self._pid = os.getpid()
        self.id = uuid.uuid4().hex
        self.inbox = keys.inbox(self.id)
        self.taken = 0  # entries taken from the inbox so far (by the thread: see Backlog)
        self._steps: dict[str, Gathered] = {}  # by step key
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._multi_pop = True  # BLMPOP, until Redis says it has none (before 7.0)
        self._forgotten: list[str] = []  # keys to delete with the next finished steps'

    def new_key(self) -> str:
        """A fresh step key whose reports come to this gatherer's inbox (``keys.inbox``)."""
        with self._lock:
            self._after_fork()
            return f"{self.id}.{uuid.uuid4().hex}"

    def add(self, step: Gathered) -> None:
        """Gather ``step``'s reports from now on (its thread starts if it is not running):
        before the step's messages are published, so none of its reports is dropped."""
        with self._lock:
            self._after_fork()
            self._steps[step.key] = step
            self._start()

    def forget(self, names: Sequence[str]) -> None:
        """Delete the keys ``names`` (results no restart needs any more) at the thread's
        next look at every step, soon; started for them if it is not running."""
        with self._lock:
            self._after_fork()
            self._forgotten.extend(names)
            self._start()

    def _after_fork(self) -> None:
        """In a process forked from the one that made this gatherer (a server that builds
        its executor, then forks its workers): an inbox of its own, and no thread yet. The
        parent's thread is not in this process, and two processes blocking on one list
        would take each other's reports. (The caller holds the lock.)"""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self.id = uuid.uuid4().hex
        self.inbox = keys.inbox(self.id)
        self.taken = 0
        self._steps, self._forgotten, self._thread = {}, [], None

    def _start(self) -> bool:
        """Start the thread unless it runs (the caller holds the lock); whether it started."""
        if self._thread is not None:
            return False
        self._thread = threading.Thread(target=self._run, name="bulksync-gatherer", daemon=True)
        self._thread.start()
        return True

    def remove(self, step: Gathered) -> None:
        """Stop gathering ``step`` (its dispatch failed: nothing of it is awaited)."""
        with self._lock:
            self._steps.pop(step.key, None)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end, as it does soon after no
        step is left; whether it has ended."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    @property
    def steps(self) -> int:
        """How many steps are gathered now."""
        with self._lock:
            return len(self._steps)

    def _run(self) -> None:
        next_probe = time.monotonic() + self.settings.idle_wait
        chores_due = 0.0
        last_left = time.monotonic()  # when a step was last dropped, finished
        while True:
            try:
                now = time.monotonic()
                if now >= chores_due:
                    # The chores look at every step: done at most every CHORES seconds, not
                    # after each report, so a thousand steps in flight cost no more per report.
                    began = now
                    steps, dropped = self._close_finished()
                    last_left = now if dropped else last_left
                    if not steps:
                        if now - last_left < LINGER:
                            # A loop's next step, or the next run's first, often comes
                            # within milliseconds: its reports find the thread still there.
                            chores_due = min(last_left + LINGER, now + CHORES)
                            self._turn_once(chores_due)
                            continue
                        with self._lock:  # (the lock add() and forget() start threads under)
                            if not self._steps and not self._forgotten:
                                self._thread = None
                                return
                        continue
                    for step in steps:
                        step.expire()
                    self._survey_claims(steps)
                    if now >= next_probe:
                        self._probe(steps)
                        next_probe = time.monotonic() + self.settings.idle_wait
                    hint = min([s.wait_hint() for s in steps] + [next_probe - now])
                    took = time.monotonic() - began
                    # Never more than a tenth of the thread's time: reports come first.
                    chores_due = began + took + min(max(hint, 0.0), max(CHORES, 9 * took))
                self._turn_once(chores_due)
            except redis.RedisError as exc:
                if not is_transient_redis(exc):
                    raise
                log.warning("gatherer: Redis unreachable (%s); retrying", exc)
                time.sleep(self.settings.reconnect_wait)  # reconnect backoff, not a poll
            except Exception:  # a bug in the chores must not stall every step
                log.exception("gatherer: looking at the steps failed")

    def _turn_once(self, until: float) -> None:
        """Block until the inbox has entries (or ``until``, when chores are due); hand them
        to their steps."""
        wait = max(0.01, min(until - time.monotonic(), self.settings.idle_wait))
        count = self.settings.drain_size
        if self._multi_pop:
            try:
                found: Any = self.redis.blmpop(wait, 1, self.inbox, direction="LEFT", count=count)
            except redis.ResponseError as exc:
                if not is_unknown_command(exc):
                    raise
                log.info("gatherer: this Redis has no BLMPOP (before 7.0): BLPOP, then LPOP")
                self._multi_pop = False
                return
            if found is not None:
                self._hand(found[1])
            return
        item: Any = self.redis.blpop([self.inbox], timeout=wait)
        if item is None:
            return
        self._hand([item[1]])  # first, so no later failure loses what BLPOP took
        if count > 1:
            rest: Any = self.redis.lpop(self.inbox, count - 1)
            if rest:
                self._hand(rest)

    def _hand(self, entries: list[bytes]) -> None:
        """Give each step its entries among ``entries``, in order (those of a step no
        longer gathered are dropped)."""
        self.taken += len(entries)
        mine: dict[str, list[bytes]] = {}
        for raw in entries:
            key, entry = wire.address_of(raw)
            mine.setdefault(key, []).append(entry)
        with self._lock:
            found = [(self._steps.get(key), got) for key, got in mine.items()]
        for step, got in found:
            if step is None:
                continue
            try:
                step.receive(got)
            except Exception:  # a bug in one step's handling must not lose the others'
                log.exception("gatherer: handling a report of step %s failed", step.key)

    def _survey_claims(self, steps: list[Gathered]) -> None:
        """Look at the claims of every step due a look, in one round trip."""
        asked, replies = self._in_one_trip(steps, lambda s, pipe: s.ask_claims(pipe))
        self._answer(asked, replies, lambda s, r: s.heard_claims(r))

    def _probe(self, steps: list[Gathered]) -> None:
        """Ask Redis, in one round trip, about every step quiet for ``idle_wait`` seconds,
        and how many entries the inbox holds (``Backlog``)."""
        now = time.monotonic()
        quiet = [s for s in steps if s.is_open() and now - s.last_seen >= self.settings.idle_wait]
        if not quiet:
            return

        def ask(step: Gathered, pipe: Any) -> bool:
            step.probe(pipe)
            return True

        # The inbox's length last: every result the steps' reads find was reported before it.
        asked, replies = self._in_one_trip(quiet, ask, then=lambda pipe: pipe.llen(self.inbox))
        backlog = Backlog(self.taken, self.taken + int(replies[-1]))
        self._answer(asked, replies, lambda s, r: s.settle(r, backlog))

    def _in_one_trip(
        self,
        steps: list[Gathered],
        ask: Callable[[Gathered, Any], bool],
        then: Callable[[Any], Any] | None = None,
    ) -> tuple[list[tuple[Gathered, int, int]], list[Any]]:
        """Queue each step's reads (``ask``: False when it has none) on one pipeline, then
        ``then``'s, and run it: the steps that asked, with where their replies are, and the
        replies (``then``'s last)."""
        pipe = self.redis.pipeline(transaction=False)
        asked: list[tuple[Gathered, int, int]] = []
        for step in steps:
            before = len(pipe)
            if ask(step, pipe):
                asked.append((step, before, len(pipe)))
        if not asked:
            return [], []
        if then is not None:
            then(pipe)
        return asked, pipe.execute() if len(pipe) else []

    def _answer(
        self,
        asked: list[tuple[Gathered, int, int]],
        replies: list[Any],
        answer: Callable[[Gathered, list[Any]], None],
    ) -> None:
        """Hand each step that asked its own replies (``answer``)."""
        for step, start, end in asked:
            try:
                answer(step, replies[start:end])
            except redis.RedisError:
                raise
            except Exception:  # a bug in one step's handling must not stall the others
                log.exception("gatherer: handling the replies of step %s failed", step.key)

    def _close_finished(self) -> tuple[list[Gathered], int]:
        """Drop the steps that owe nothing more (and their Redis keys) and the keys
        forgotten; the other steps, and how many were dropped."""
        with self._lock:
            done = [s for s in self._steps.values() if not s.is_open()]
            for step in done:
                del self._steps[step.key]
            left = list(self._steps.values())
            forgotten, self._forgotten = self._forgotten, []
        if done or forgotten:
            try:
                pipe = self.redis.pipeline(transaction=False)
                for step in done:
                    step.drop_keys(pipe)
                for i in range(0, len(forgotten), FORGET_BATCH):
                    pipe.unlink(*forgotten[i : i + FORGET_BATCH])
                pipe.execute()
            except redis.RedisError as exc:  # the keys expire on their own
                log.warning(
                    "gatherer: could not drop the keys of %d steps and %d results (%s)",
                    len(done),
                    len(forgotten),
                    exc,
                )
        return left, len(done)
