"""Recording task results on a worker: first result wins, several in one round trip.

A task's result goes to its slot with an atomic script (below): the first result for a slot
is kept, whichever delivery arrives reports *that* result to the step's inbox, and the task's
claim is dropped in the same script, so no one sees the claim gone and the result not
reported. One script records several results (:meth:`Recorder.write`), and they reach the
inbox together.

The async tasks of a process share one event loop; many of them finish together (a fan-out of
model calls), as do the sync tasks of a message on the task threads. :meth:`Recorder.record`
(from the loop) and :meth:`Recorder.commit` (from a thread) let them share round trips: a
result that finishes while a write is under way waits for the next one, which carries
everything that piled up meanwhile (a group commit). The loop's writes run on a thread, so
it never blocks on Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Sequence
from typing import Any, Final

import redis

from bulksync import keys
from bulksync.retry import is_transient_redis, retry
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.celery.claims import Held

# Records several results. Per result, KEYS: result key, inbox, step hash, claim (the result
# key again when none); ARGV after the result and step TTLs: result, keep ("1"/"0"), claim
# token ("": none), the step's address (``wire.addressed``). Keep the first result unless
# told not to (an error: the same slot must run again when the run is retried); report the
# kept one to this delivery's inbox while its step lives; drop the claim if this process
# still holds it. One script for several results puts them in the inbox at once: the
# coordinator's gatherer takes them in one call.
_RECORD_LUA: Final = """
local kept_own = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = i * 4, 2 + i * 4
  local data, keep, token, address = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  if token ~= '' and redis.call('GET', KEYS[k + 4]) == token then
    redis.call('DEL', KEYS[k + 4])
  end
  local kept = redis.call('GET', KEYS[k + 1])
  if not kept then
    kept = data
    if keep == '1' then
      redis.call('SET', KEYS[k + 1], data, 'EX', ARGV[1])
    end
  end
  if redis.call('EXISTS', KEYS[k + 3]) == 1 then
    redis.call('RPUSH', KEYS[k + 2], address .. 'r' .. kept)
    redis.call('EXPIRE', KEYS[k + 2], ARGV[2])
  end
  kept_own[i + 1] = kept == data and 1 or 0
end
return kept_own
"""

RECORDS_PER_SCRIPT: Final = 64
"""Results one script records at most: a big batch is several scripts, so none holds Redis
for long."""


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One result to record: the step it reports to, its slot and bytes; whether it is kept
    (an error is reported, not kept: a retry of the run must run the task again); the claim
    it drops."""

    step_key: str
    slot: str
    data: bytes
    keep: bool = True
    claim: Held | None = None


class Recorder:
    """Writes a worker process's task results to Redis."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self._pending: list[tuple[Record, asyncio.Future[bool]]] = []
        self._writing = False
        self._turn = threading.Condition()
        self._queued: list[_Ticket] = []
        self._committing = False

    def write(self, records: Sequence[Record]) -> list[bool]:
        """Record ``records`` in one round trip, retried through a Redis outage of up to
        ``retry_window`` seconds (recording again reports the same result); for each, True
        if its own result is the one reported (not an earlier delivery's)."""
        if not records:
            return []

        def send() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            self.queue(pipe, records)
            return pipe.execute()

        what = f"recording {len(records)} result(s), the first of {records[0].slot}"
        replies = retry(
            send, transient=is_transient_redis, window=self.settings.retry_window, what=what
        )
        return self.written(records, replies)

    def queue(self, pipe: Any, records: Sequence[Record]) -> int:
        """Queue on ``pipe`` the scripts recording ``records``, to write them in a round trip
        that does more; how many commands that is (their replies are :meth:`written`'s)."""
        for start in range(0, len(records), RECORDS_PER_SCRIPT):
            keys_: list[str] = []
            args: list[Any] = [self.settings.result_ttl, self.settings.step_ttl]
            for rec in records[start : start + RECORDS_PER_SCRIPT]:
                result = keys.result(rec.slot)
                claim = rec.claim.key if rec.claim is not None else result
                keys_ += [result, keys.inbox(rec.step_key), keys.step(rec.step_key), claim]
                token = rec.claim.token if rec.claim is not None else ""
                address = wire.addressed(rec.step_key, b"")
                args += [rec.data, "1" if rec.keep else "0", token, address]
            pipe.eval(_RECORD_LUA, len(keys_), *keys_, *args)
        return math.ceil(len(records) / RECORDS_PER_SCRIPT)

    @staticmethod
    def written(records: Sequence[Record], replies: Sequence[Any]) -> list[bool]:
        """What :meth:`write` answers, from the replies to :meth:`queue`'s commands: for
        each record, whether its own result is the one reported. Their claims are dropped."""
        for rec in records:
            if rec.claim is not None:
                rec.claim.released = True
        return [bool(k) for reply in replies for k in reply]

    def commit(self, rec: Record) -> bool:
        """:meth:`write` ``rec`` from a thread, together with the results other threads
        commit meanwhile; blocks until it is written."""
        ticket = _Ticket(rec)
        with self._turn:
            self._queued.append(ticket)
            while self._committing and not ticket.done:
                self._turn.wait()
            if ticket.done:
                return ticket.answer()
            self._committing = True  # this thread writes everything queued
            batch, self._queued = self._queued, []
        try:
            kept = self.write([t.rec for t in batch])
        except Exception as exc:  # each waiter raises it: its task failed to record
            for t in batch:
                t.error = exc
        else:
            for t, answer in zip(batch, kept, strict=True):
                t.kept = answer
        finally:
            with self._turn:
                for t in batch:
                    t.done = True
                self._committing = False
                self._turn.notify_all()
        return ticket.answer()

    async def record(self, rec: Record) -> bool:
        """:meth:`write` ``rec`` from a coroutine on the process's event loop, together with
        the results other tasks record meanwhile."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((rec, done))
        if not self._writing:
            self._writing = True
            asyncio.get_running_loop().create_task(self._write_pending())
        return await done

    async def _write_pending(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    kept = await asyncio.to_thread(self.write, [rec for rec, _ in batch])
                except Exception as exc:  # each waiter raises it: its task failed to record
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                else:
                    for (_, done), answer in zip(batch, kept, strict=True):
                        if not done.done():
                            done.set_result(answer)
        finally:
            self._writing = False


@dataclasses.dataclass(slots=True)
class _Ticket:
    """A result a thread waits to see written, and what its write said."""

    rec: Record
    done: bool = False
    kept: bool = False
    error: Exception | None = None

    def answer(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.kept
