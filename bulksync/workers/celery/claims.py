"""Task claims: one live runner per task, kept alive by heartbeats, its loss noticed.

A worker **claims** a task's slot before running it (``SET NX`` with a lease, in a script
that also counts the delivery and checks the run's cancel flag, that the step is not over
and the slot's result; one script claims the tasks of a message it takes at once). A claim
may also **reserve** the slot without counting: the tasks a delivery runs one by one are
reserved together with the step's read and counted one by one as each starts
(``starts.py``), so a task that kills its process counts against itself only, never against
the tasks queued behind it. A heartbeat thread of its process renews the lease of every
claim it holds while the tasks run — however long they run, so a long task is never taken
for lost. A second delivery of a task whose claim is live acknowledges its message and
leaves: its pool slot stays free for other work, and if the claim's holder dies the
coordinator dispatches the task again (below), so nothing waits on the duplicate. A claim
whose worker died expires with its lease; one held by a dead process of the same host (a
pool process killed mid-task) is taken over at once.

The coordinator's side (:class:`ClaimWatch`, one per dispatched step) looks at the claims of
its unfinished tasks every claim heartbeat (``Settings.claim_interval``):

- a task started since it was last published (its delivery count grew), with no live claim
  and no result, has lost its worker: it is published again, unless it has already started
  ``max_deliveries`` times — then it fails with ``WorkerLostError`` (a poison task). It must be
  seen so twice in a row: a worker reports a result to the inbox before it drops its claim,
  and the gatherer reads the inbox between two looks, so a task that just finished is never
  taken for lost;
- a task never started ``unstarted_grace`` seconds after it was published (its message may
  be lost) is published again, the grace doubling each time so that a long queue is not
  flooded with copies. Publishing again is idempotent: the copies share the task's slot, and
  its claim and first-result-wins keep the effect single.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Final

import redis

from bulksync import keys
from bulksync.settings import Settings

log = logging.getLogger(__name__)

HELD: Final = 0
"""``claim``: another live worker holds the task's claim; leave it be."""
POISONED: Final = -1
"""``claim``: the task started ``max_deliveries`` times without finishing; fail it."""
CANCELLED: Final = -2
"""``claim``: the task's run was cancelled, or its step is over (its hash is gone: finished,
or lost with Redis, and then dispatched again); run nothing more of it."""
KNOWN: Final = -3
"""``claim``: the task already has a result; report it, run nothing."""

# Claims several slots. KEYS: the run's cancel flag, the step's hash, then per slot: claim,
# deliveries, result. ARGV: token, lease ms, max deliveries, count TTL, how many of the first
# slots to count as started (the others are reserved: each start is counted as it starts).
# Returns, per slot, the delivery number (> 0) when claimed, else one of the verdicts above.
# A poisoned slot keeps its count, so every later copy of its message is refused too; the
# step's end (its stop, on a failure) deletes the counts after its hash
# (``CeleryStep._queue_over``), so a retry of the run gets its attempts afresh and a copy
# that comes between finds the step over.
_CLAIM_LUA: Final = """
local over = redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 0
local found = {}
for i = 3, #KEYS, 3 do
  local claim, count, result = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  local verdict
  if over then
    verdict = -2
  elseif redis.call('EXISTS', result) == 1 then
    verdict = -3
  elseif not redis.call('SET', claim, ARGV[1], 'NX', 'PX', ARGV[2]) then
    verdict = 0
  elseif tonumber(redis.call('GET', count) or '0') >= tonumber(ARGV[3]) then
    redis.call('DEL', claim)
    verdict = -1
  elseif i / 3 <= tonumber(ARGV[5]) then
    verdict = redis.call('INCR', count)
    redis.call('EXPIRE', count, ARGV[4])
  else
    verdict = tonumber(redis.call('GET', count) or '0') + 1
  end
  found[#found + 1] = verdict
end
return found
"""

CLAIMS_PER_SCRIPT: Final = 256
"""Slots one claim script takes at most: a big message's claims are several scripts, so none
holds Redis for long."""

# KEYS: claims. ARGV: token, lease ms. Renew only claims this process still holds.
_RENEW_LUA: Final = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('PEXPIRE', key, ARGV[2]) end
end
return 0
"""

# KEYS: claim. ARGV: token. Drop the claim if it is still this process's.
_RELEASE_LUA: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclasses.dataclass(slots=True)
class Held:
    """A claim a task of this process holds: its key, its holder's token, and whether it was
    dropped already."""

    key: str
    token: str
    released: bool = False


class ClaimKeeper:
    """The claims one worker process holds, and the heartbeat thread that renews them."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.token = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held: dict[str, int] = {}  # claim key -> tasks of this process holding it
        self._lock = threading.Lock()
        self._beating = False

    def claim(self, slot: str, run_id: str, step_key: str) -> int:
        """Claim ``slot`` (a task of step ``step_key`` of run ``run_id``) for this process:
        the delivery number (> 0), or a verdict."""
        return self.claim_many([slot], run_id, step_key)[0]

    def claim_many(self, slots: Sequence[str], run_id: str, step_key: str) -> list[int]:
        """:meth:`claim` each of ``slots``, in one round trip."""
        return self.verdicts(slots, run_id, step_key, self._replies(slots, run_id, step_key))

    def _replies(
        self, slots: Sequence[str], run_id: str, step_key: str, *, counted: int | None = None
    ) -> list[Any]:
        if not slots:
            return []
        pipe = self.redis.pipeline(transaction=False)
        self.ask(pipe, slots, run_id, step_key, counted=counted)
        return self.answers(pipe.execute())

    def ask(
        self,
        pipe: Any,
        slots: Sequence[str],
        run_id: str,
        step_key: str,
        *,
        counted: int | None = None,
    ) -> int:
        """Queue on ``pipe`` the claims of ``slots``, the first ``counted`` (default: all)
        counted as started, the others reserved (each counted as it starts, ``starts.py``);
        how many commands that is (their replies are :meth:`answers`')."""
        counted = len(slots) if counted is None else counted
        lease_ms = max(1, int(self.settings.claim_lease * 1000))
        for start in range(0, len(slots), CLAIMS_PER_SCRIPT):
            names = [keys.cancel(run_id), keys.step(step_key)]
            for slot in slots[start : start + CLAIMS_PER_SCRIPT]:
                names += [keys.claim(slot), keys.deliveries(slot), keys.result(slot)]
            pipe.eval(
                _CLAIM_LUA,
                len(names),
                *names,
                self.token,
                lease_ms,
                self.settings.max_deliveries,
                self.settings.result_ttl,
                max(0, counted - start),
            )
        return math.ceil(len(slots) / CLAIMS_PER_SCRIPT)

    @staticmethod
    def answers(replies: Sequence[Any]) -> list[Any]:
        """The replies to :meth:`ask`'s commands, one per slot (for :meth:`verdicts`)."""
        return [answer for reply in replies for answer in reply]

    def verdicts(
        self,
        slots: Sequence[str],
        run_id: str,
        step_key: str,
        replies: Sequence[Any],
        *,
        reserved: Collection[str] = (),
    ) -> list[int]:
        """What the replies to :meth:`ask` about ``slots`` say, as :meth:`claim` does (the
        slots ``reserved`` were asked for without counting their starts).

        A claim held by a process of this host that no longer exists (a pool process killed
        mid-task, whose worker put the message back at once) is taken over at once rather
        than after its lease.
        """
        found = [int(v) for v in replies]
        for i, slot in enumerate(slots):
            if found[i] == HELD and self._drop_dead(slot):  # claimed again, once
                counted = 0 if slot in reserved else 1
                found[i] = int(self._replies([slot], run_id, step_key, counted=counted)[0])
        return found

    def _drop_dead(self, slot: str) -> bool:
        """Drop ``slot``'s claim if a dead process of this host holds it; True if dropped."""
        key = keys.claim(slot)
        holder = self.redis.get(key)
        if not isinstance(holder, bytes):
            return True  # released meanwhile: claim again
        host, _, rest = holder.decode(errors="replace").partition(":")
        pid = rest.partition(":")[0]
        if host != os.uname().nodename or not pid.isdigit() or _alive(int(pid)):
            return False
        return bool(self.redis.eval(_RELEASE_LUA, 1, key, holder))

    def hold(self, slot: str) -> Held:
        """Keep ``slot``'s claim (taken by :meth:`claim`) alive until :meth:`unhold`."""
        claim = Held(keys.claim(slot), self.token)
        with self._lock:
            self._held[claim.key] = self._held.get(claim.key, 0) + 1
            if not self._beating:
                self._beating = True
                threading.Thread(target=self._beat, name="bulksync-claims", daemon=True).start()
        return claim

    def unhold(self, claim: Held) -> None:
        """Stop renewing ``claim`` (no Redis call: its lease runs on until dropped)."""
        with self._lock:
            left = self._held.pop(claim.key) - 1
            if left:
                self._held[claim.key] = left

    def release(self, *claims: Held) -> None:
        """Drop ``claims`` now, in one round trip, those not dropped already (and only if
        still this process's); if Redis cannot be reached, their leases run out on their own."""
        left = [claim for claim in claims if not claim.released]
        if not left:
            return
        pipe = self.redis.pipeline(transaction=False)
        for claim in left:
            pipe.eval(_RELEASE_LUA, 1, claim.key, self.token)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            more = f" and {len(left) - 1} more" if len(left) > 1 else ""
            log.warning("could not release claim %s%s: %s", left[0].key, more, exc)

    def drop(self, *claims: Held) -> None:
        """Stop renewing ``claims`` (:meth:`unhold`) and :meth:`release` them."""
        for claim in claims:
            self.unhold(claim)
        self.release(*claims)

    def _beat(self) -> None:
        lease_ms = max(1, int(self.settings.claim_lease * 1000))
        while True:
            time.sleep(self.settings.claim_interval)  # the heartbeat's period, not a poll
            with self._lock:
                held = list(self._held)
            if not held:
                continue
            try:
                self.redis.eval(_RENEW_LUA, len(held), *held, self.token, lease_ms)
            except redis.RedisError as exc:  # the next beat tries again, well within the lease
                log.warning("could not renew %d task claims: %s", len(held), exc)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class Survey:
    """What one look at a step's claims found: tasks to publish again, poison tasks, and
    where the others are."""

    republish: list[str]
    lost: list[str]
    poisoned: dict[str, int]  # task id -> times it started
    queued: dict[str, float] = dataclasses.field(default_factory=dict)
    """Tasks waiting for a worker (no claim, no result) -> seconds since first published."""
    running: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    """Tasks a worker holds -> (its claim holder, ``host:pid:…``; seconds since seen held)."""


class ClaimWatch:
    """The coordinator's eye on a step's unfinished tasks: lost workers, lost messages."""

    def __init__(self, settings: Settings, slots: dict[str, str]) -> None:
        self.settings = settings
        self.slots = slots
        now = time.monotonic()
        self._first = now
        self._published = dict.fromkeys(slots, now)
        self._held_since: dict[str, float] = {}
        self._grace = dict.fromkeys(slots, settings.unstarted_grace)
        self._starts = dict.fromkeys(slots, 0)  # deliveries counted when last published
        self._suspects: set[str] = set()
        self._next = now + settings.claim_interval

    def due(self) -> bool:
        """Whether it is time for another look."""
        return time.monotonic() >= self._next

    def remaining(self) -> float:
        """Seconds until the next look is due (0 when it is)."""
        return max(0.0, self._next - time.monotonic())

    def ask(self, pipe: Any, pending: Iterable[str]) -> list[str]:
        """Queue on ``pipe`` the reads of a look at the ``pending`` tasks (their claims,
        delivery counts and results: three replies, none when nothing is pending); the task
        ids asked about, for :meth:`judge`. The next look is due a claim interval from now."""
        self._next = time.monotonic() + self.settings.claim_interval
        ids = sorted(pending)
        if ids:
            pipe.mget([keys.claim(self.slots[t]) for t in ids])
            pipe.mget([keys.deliveries(self.slots[t]) for t in ids])
            pipe.mget([keys.result(self.slots[t]) for t in ids])
        return ids

    def judge(self, ids: list[str], replies: list[Any]) -> Survey:
        """What the replies to :meth:`ask` about ``ids`` say to do."""
        now = time.monotonic()
        if not ids:
            return Survey([], [], {})
        claims, counts, results = replies
        republish: list[str] = []
        lost: list[str] = []
        poisoned: dict[str, int] = {}
        suspects: set[str] = set()
        queued: dict[str, float] = {}
        running: dict[str, tuple[str, float]] = {}
        started = {t: int(c or 0) for t, c in zip(ids, counts, strict=True)}
        for task_id, claim, result in zip(ids, claims, results, strict=True):
            starts = started[task_id]
            if claim is not None and result is None:
                since = self._held_since.setdefault(task_id, now)
                running[task_id] = (bytes(claim).decode(errors="replace"), now - since)
            else:
                self._held_since.pop(task_id, None)
            if claim is not None or result is not None:
                continue
            queued[task_id] = now - self._first
            if starts > self._starts[task_id]:
                if task_id not in self._suspects:
                    suspects.add(task_id)  # seen once: wait for the inbox to be read
                elif starts >= self.settings.max_deliveries:
                    poisoned[task_id] = starts
                else:
                    lost.append(task_id)
            elif now - self._published[task_id] >= self._grace[task_id]:
                republish.append(task_id)
                self._grace[task_id] *= 2
        self._suspects = suspects
        for task_id in [*republish, *lost]:
            self._published[task_id] = now
            self._starts[task_id] = started[task_id]
        return Survey(republish, lost, poisoned, queued, running)
