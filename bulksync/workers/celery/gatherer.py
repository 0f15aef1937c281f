"""One gatherer per executor: a thread that blocks on every live step's inbox at once.

A step's tasks report to its inbox (``keys.inbox``). Rather than one thread and one held
Redis connection per waiting step (a thousand runs would need a thousand connections, past
any pool's cap), an executor's :class:`Gatherer` runs one ``BLMPOP`` over all live inboxes,
plus a wake-up list (``keys.gatherer_wake``) that a joining step pushes to, so the next
``BLMPOP`` includes its inbox (it comes last: a busy gatherer lists the new step at its next
turn anyway, so a wake-up only ends a wait, and never costs a turn while reports come in).
One call takes every entry an inbox has (up to ``drain_size``), or every wake-up queued. The
inboxes are listed in a rotating order, since ``BLMPOP`` serves the first non-empty list it is
given: no busy step starves another. A Redis before 7.0 has no ``BLMPOP``: there the gatherer
takes one entry with ``BLPOP``, then the rest of that inbox with ``LPOP``.

**Nothing taken is lost.** Entries taken are handed to their step before anything else is
asked of Redis (with ``BLPOP``, the first entry before the rest is drained; a failure there
leaves the rest in Redis for the next turn). A reply lost with its connection (Redis pops the
entries, the socket drops before they arrive) cannot be taken back, so every ``idle_wait``
seconds the gatherer probes the steps it heard nothing from in that time: a result recorded
in its slot (``keys.result``) but never seen in the inbox is delivered from there (first
result wins, so a duplicate changes nothing), and a step whose keys Redis lost is dispatched
again.

Task deadlines, claim surveys and dropping finished steps look at every step, so they are
done at most every ``CHORES`` seconds rather than after each report, and take at most a
tenth of the thread's time however many steps are in flight. The results of a step whose
checkpoint is committed (``forget``) are deleted then too, off the loop's thread.

Redis errors are logged and retried after ``reconnect_wait`` seconds, for as long as steps
wait: an outage delays a step, it never fails one. The thread ends when no step is left and
starts again with the next one.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from bulksync import keys
from bulksync.retry import is_transient_redis, is_unknown_command
from bulksync.settings import Settings

log = logging.getLogger(__name__)

CHORES = 0.05
"""Seconds between two looks at every step (task deadlines, claim surveys, finished steps):
a deadline is seen at most this late — or, when so many steps are in flight that a look
takes longer than a tenth of that, nine looks' time late."""


FORGET_BATCH = 1000
"""Keys one ``UNLINK`` deletes, when the results of a wide step are forgotten."""


class Gathered(Protocol):
    """What a gatherer needs of a step in flight (``CeleryStep``)."""

    inbox: str
    last_seen: float

    def receive(self, entries: Sequence[bytes]) -> None:
        """Handle entries taken from the inbox, in order."""

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

    def settle(self, replies: list[Any]) -> None:
        """Act on the replies to ``probe``: deliver stray results, dispatch lost keys again."""

    def drop_keys(self, pipe: Any) -> None:
        """Queue on ``pipe`` the deletion of the finished step's keys."""


class Gatherer:
    """Gathers the reports of every step an executor has in flight, on one thread."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.wake_key = keys.gatherer_wake(uuid.uuid4().hex)
        self._steps: dict[str, Gathered] = {}  # by inbox key
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._turn = 0
        self._joined = False  # a step joined since the gatherer's list was taken
        self._multi_pop = True  # BLMPOP, until Redis says it has none (before 7.0)
        self._forgotten: list[str] = []  # keys to delete with the next finished steps'

    def add(self, step: Gathered, pipe: Any) -> None:
        """Gather ``step``'s inbox from now on. The running thread is woken to list it by
        commands queued on ``pipe``, the pipeline that stores the step (with none running,
        one starts, and lists it in its first ``BLPOP``)."""
        with self._lock:
            self._steps[step.inbox] = step
            self._joined = True
            if self._start():
                return
        pipe.rpush(self.wake_key, b"1")
        pipe.expire(self.wake_key, self.settings.step_ttl)

    def forget(self, names: Sequence[str]) -> None:
        """Delete the keys ``names`` (results no restart needs any more) at the thread's
        next look at every step, soon; started for them if it is not running."""
        with self._lock:
            self._forgotten.extend(names)
            self._start()

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
            self._steps.pop(step.inbox, None)

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
        steps: list[Gathered] = []
        while True:
            try:
                now = time.monotonic()
                if now >= chores_due:
                    # The chores look at every step: done at most every CHORES seconds, not
                    # after each report, so a thousand steps in flight cost no more per report.
                    began = now
                    steps = self._close_finished()
                    if not steps:
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
                elif self._joined:
                    steps = self._current()
                self._turn_once(steps, chores_due)
            except redis.RedisError as exc:
                if not is_transient_redis(exc):
                    raise
                log.warning("gatherer: Redis unreachable (%s); retrying", exc)
                time.sleep(self.settings.reconnect_wait)  # reconnect backoff, not a poll
            except Exception:  # a bug in one step's handling must not stall all the others
                log.exception("gatherer: handling a report failed")

    def _current(self) -> list[Gathered]:
        """The steps gathered now (after a step joined)."""
        with self._lock:
            self._joined = False
            return list(self._steps.values())

    def _turn_once(self, steps: list[Gathered], until: float) -> None:
        """Block until some inbox has entries (or ``until``, when chores are due); hand
        them to their step."""
        wait = max(0.01, min(until - time.monotonic(), self.settings.idle_wait))
        self._turn = (self._turn + 1) % len(steps)
        # The wake-up list comes last: a step that joined is listed at the next turn anyway,
        # so a wake-up need only end a block, never take a turn from the reports.
        lists = [*(s.inbox for s in steps[self._turn :] + steps[: self._turn]), self.wake_key]
        count = self.settings.drain_size
        if self._multi_pop:
            try:
                found: Any = self.redis.blmpop(
                    wait, len(lists), *lists, direction="LEFT", count=count
                )
            except redis.ResponseError as exc:
                if not is_unknown_command(exc):
                    raise
                log.info("gatherer: this Redis has no BLMPOP (before 7.0): BLPOP, then LPOP")
                self._multi_pop = False
                return
            if found is not None:  # every wake-up queued, or the entries of one inbox
                self._hand(found[0].decode(), found[1])
            return
        item: Any = self.redis.blpop(lists, timeout=wait)
        if item is None:
            return
        name = item[0].decode()
        if name == self.wake_key:
            # Every step added before this wake-up is listed by the next BLPOP: the other
            # wake-ups queued meanwhile say nothing new.
            self.redis.delete(self.wake_key)
            return
        step = self._hand(name, [item[1]])  # first, so no later failure loses what BLPOP took
        if step is not None:
            rest: Any = self.redis.lpop(name, count)
            if rest:
                step.receive(rest)

    def _hand(self, name: str, entries: list[bytes]) -> Gathered | None:
        """Give ``entries`` taken from list ``name`` to its step (a wake-up's are dropped:
        the next turn lists every step added before them); that step, if any."""
        with self._lock:
            step = self._steps.get(name)
        if step is not None:
            step.receive(entries)
        return step

    def _survey_claims(self, steps: list[Gathered]) -> None:
        """Look at the claims of every step due a look, in one round trip."""
        self._in_one_trip(steps, lambda s, pipe: s.ask_claims(pipe), lambda s, r: s.heard_claims(r))

    def _probe(self, steps: list[Gathered]) -> None:
        """Ask Redis, in one round trip, about every step quiet for ``idle_wait`` seconds."""
        now = time.monotonic()
        quiet = [s for s in steps if s.is_open() and now - s.last_seen >= self.settings.idle_wait]

        def ask(step: Gathered, pipe: Any) -> bool:
            step.probe(pipe)
            return True

        self._in_one_trip(quiet, ask, lambda s, replies: s.settle(replies))

    def _in_one_trip(
        self,
        steps: list[Gathered],
        ask: Callable[[Gathered, Any], bool],
        answer: Callable[[Gathered, list[Any]], None],
    ) -> None:
        """Queue each step's reads (``ask``: False when it has none) on one pipeline, then
        hand each its own replies (``answer``)."""
        pipe = self.redis.pipeline(transaction=False)
        asked: list[tuple[Gathered, int, int]] = []
        for step in steps:
            before = len(pipe)
            if ask(step, pipe):
                asked.append((step, before, len(pipe)))
        if not asked:
            return
        replies = pipe.execute() if len(pipe) else []
        for step, start, end in asked:
            try:
                answer(step, replies[start:end])
            except redis.RedisError:
                raise
            except Exception:  # a bug in one step's handling must not stall the others
                log.exception("gatherer: handling the replies of %s failed", step.inbox)

    def _close_finished(self) -> list[Gathered]:
        """Drop the steps that owe nothing more (and their Redis keys) and the keys
        forgotten; the other steps."""
        with self._lock:
            done = [s for s in self._steps.values() if not s.is_open()]
            for step in done:
                del self._steps[step.inbox]
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
        return left
