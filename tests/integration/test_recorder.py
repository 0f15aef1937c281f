"""A worker's task results and claims on real Redis, several in one round trip: results written
together (first result wins each slot), results of threads and of coroutines that finish
together sharing a write, and a message's claims taken at once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bulksync import keys
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.celery import claims, starts
from bulksync.workers.celery.claims import ClaimKeeper
from bulksync.workers.celery.recorder import Record, Recorder
from bulksync.workers.celery.starts import StartCounter

pytestmark = pytest.mark.integration


class CountingRedis(redis.Redis):
    """A real client that counts its round trips (a pipeline is one)."""

    trips = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.trips += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        self.trips += 1
        return super().pipeline(transaction=transaction, shard_hint=shard_hint)


class SlowRecorder(Recorder):
    """Writes as usual, a little slowly, keeping the size of each write."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        super().__init__(client, settings)
        self.batches: list[int] = []

    def write(self, records: Sequence[Record]) -> list[bool]:
        self.batches.append(len(records))
        time.sleep(0.05)  # the others arrive meanwhile
        return super().write(records)


@pytest.fixture
def r(redis_url: str) -> Iterator[CountingRedis]:
    client = CountingRedis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def step(r: CountingRedis) -> Iterator[str]:
    """A live step: its results are reported to its inbox."""
    step_key = f"test-{uuid.uuid4().hex}"
    r.hset(keys.step(step_key), "state", b"-")
    yield step_key
    r.delete(keys.step(step_key), keys.inbox(step_key))


def _slots(step_key: str, n: int) -> list[str]:
    return [f"{step_key}-slot{i}" for i in range(n)]


def _cleanup(r: redis.Redis, slots: list[str]) -> None:
    for slot in slots:
        r.delete(keys.result(slot), keys.claim(slot), keys.deliveries(slot))


def test_write_records_several_results_in_one_round_trip(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    keeper = ClaimKeeper(r, settings)
    first, second, known = slots = _slots(step, 3)
    try:
        r.set(keys.result(known), b"earlier")  # another delivery recorded it first
        assert keeper.claim(first, "run", step) == 1
        claim = keeper.hold(first)
        recorder = Recorder(r, settings)
        r.trips = 0
        kept = recorder.write(
            [
                Record(step, first, b"one", claim=claim),
                Record(step, second, b"two", keep=False),
                Record(step, known, b"late"),
            ]
        )
        assert r.trips == 1
        assert kept == [True, True, False]
        assert claim.released and r.get(keys.claim(first)) is None
        assert r.mget([keys.result(s) for s in slots]) == [b"one", None, b"earlier"]
        reported = [wire.addressed(step, e) for e in (b"rone", b"rtwo", b"rearlier")]
        assert r.lrange(keys.inbox(step), 0, -1) == reported
        keeper.unhold(claim)
    finally:
        _cleanup(r, slots)


def test_threads_that_finish_together_share_a_write(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    recorder = SlowRecorder(r, settings)
    slots = _slots(step, 8)
    answers: list[bool] = []
    go = threading.Barrier(len(slots))

    def finish(slot: str) -> None:
        go.wait()
        answers.append(recorder.commit(Record(step, slot, slot.encode())))

    threads = [threading.Thread(target=finish, args=(s,)) for s in slots]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [True] * len(slots)
        assert sum(recorder.batches) == len(slots) and len(recorder.batches) < len(slots)
        reported = sorted(wire.addressed(step, b"r" + s.encode()) for s in slots)
        assert sorted(r.lrange(keys.inbox(step), 0, -1)) == reported
    finally:
        _cleanup(r, slots)


def test_coroutines_that_finish_together_share_a_write(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    recorder = SlowRecorder(r, settings)
    slots = _slots(step, 10)

    async def finish_all() -> list[bool]:
        async def finish(slot: str, after: float) -> bool:
            await asyncio.sleep(after)
            return await recorder.record(Record(step, slot, b"x"))

        # Five finish at once; five more while the first write is under way.
        return await asyncio.gather(*(finish(s, 0.02 * (i >= 5)) for i, s in enumerate(slots)))

    try:
        assert asyncio.run(finish_all()) == [True] * len(slots)
        assert recorder.batches == [5, 5]
        assert r.llen(keys.inbox(step)) == len(slots)
    finally:
        _cleanup(r, slots)


def test_a_failed_write_fails_every_result_it_carried(settings: Settings) -> None:
    unreachable = redis.Redis(port=1, retry=Retry(NoBackoff(), 0))  # nothing listens there
    recorder = SlowRecorder(unreachable, dataclasses.replace(settings, retry_window=0.01))
    errors: list[BaseException] = []

    def finish() -> None:
        try:
            recorder.commit(Record("step", f"slot-{uuid.uuid4().hex}", b"x"))
        except redis.ConnectionError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 4

    async def finish_two() -> list[Any]:
        rec = Record("step", "slot", b"x")
        return await asyncio.gather(
            recorder.record(rec), recorder.record(rec), return_exceptions=True
        )

    assert [type(e) for e in asyncio.run(finish_two())] == [redis.ConnectionError] * 2


def test_a_messages_claims_are_taken_in_one_round_trip(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    keeper = ClaimKeeper(r, settings)
    fresh, held, known = slots = _slots(step, 3)
    run_id = f"run-{uuid.uuid4().hex}"
    try:
        r.set(keys.claim(held), b"a live worker elsewhere:1:x")
        r.set(keys.result(known), b"done")
        r.trips = 0
        assert keeper.claim_many(slots, run_id, step) == [1, claims.HELD, claims.KNOWN]
        # The held one: one more look at its holder, which lives on another host.
        assert r.trips == 2
        assert r.get(keys.claim(fresh)) == keeper.token.encode()
        r.set(keys.cancel(run_id), b"1")
        assert keeper.claim_many(_slots(step + "x", 2), run_id, step) == [claims.CANCELLED] * 2
    finally:
        r.delete(keys.cancel(run_id))
        _cleanup(r, slots)


def test_one_script_claims_several_slots_each_with_its_own_verdict(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    keeper = ClaimKeeper(r, settings)
    fresh, held, known, poisoned = slots = _slots(step, 4)
    try:
        r.set(keys.claim(held), b"another worker")
        r.set(keys.result(known), b"done")
        r.set(keys.deliveries(poisoned), settings.max_deliveries)
        r.trips = 0
        found = keeper.claim_many(slots, "run", step)
        assert r.trips == 2  # the claims, then a look at the held claim's holder
        assert found == [1, claims.HELD, claims.KNOWN, claims.POISONED]
        assert r.get(keys.claim(fresh)) == keeper.token.encode()
        # Its count stays: every later copy of its message is refused too.
        assert r.get(keys.deliveries(poisoned)) == str(settings.max_deliveries).encode()
        assert r.get(keys.claim(poisoned)) is None
        assert keeper.claim(poisoned, "run", step) == claims.POISONED
        assert r.get(keys.claim(held)) == b"another worker"
    finally:
        _cleanup(r, slots)


def test_reserved_slots_are_claimed_without_counting_their_starts(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    keeper = ClaimKeeper(r, settings)
    slots = _slots(step, claims.CLAIMS_PER_SCRIPT + 2)  # two scripts: the count spans them
    counted = claims.CLAIMS_PER_SCRIPT + 1
    poisoned = slots[-1]
    try:
        r.set(keys.deliveries(poisoned), settings.max_deliveries)
        pipe = r.pipeline(transaction=False)
        keeper.ask(pipe, slots[1:], "run", step, counted=0)  # reserved
        replies = keeper.answers(pipe.execute())
        assert replies == [1] * (len(slots) - 2) + [claims.POISONED]  # (the first start each)
        counts = r.mget([keys.deliveries(s) for s in slots[1:]])
        assert counts == [None] * (len(slots) - 2) + [str(settings.max_deliveries).encode()]
        for slot in slots[1:-1]:
            r.delete(keys.claim(slot))
        r.delete(keys.deliveries(poisoned))  # (its step's end: a retry starts afresh)
        pipe = r.pipeline(transaction=False)
        keeper.ask(pipe, slots, "run", step, counted=counted)  # the first ones count, the rest not
        assert keeper.answers(pipe.execute()) == [1] * len(slots)
        counts = r.mget([keys.deliveries(s) for s in slots])
        assert counts == [b"1"] * counted + [None]
        assert all(r.ttl(keys.deliveries(s)) > 0 for s in slots[:counted])
        assert r.mget([keys.claim(s) for s in slots]) == [keeper.token.encode()] * len(slots)
    finally:
        _cleanup(r, slots)


def test_a_start_counter_counts_before_it_returns_and_reads_the_replies_later(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    counter = StartCounter(r, settings)
    slots = _slots(step, starts.UNREAD // 2)  # two commands each: the last makes UNREAD
    try:
        r.trips = 0
        for slot in slots[:-1]:
            counter.count([slot])
        assert counter._unread == starts.UNREAD - 2  # none read yet: nothing waited for
        counter.count(slots[-1:])
        assert counter._unread == 0
        assert r.trips == 0  # its own connection, out of the client's pool
        assert r.mget([keys.deliveries(s) for s in slots]) == [b"1"] * len(slots)
        assert all(r.ttl(keys.deliveries(s)) > 0 for s in slots)
    finally:
        counter.close()
        _cleanup(r, slots)


def test_a_start_counter_writes_on_a_new_connection_once_the_server_closed_its_own(
    r: CountingRedis, step: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(starts, "IDLE", 0.0)  # look at the connection before every write
    counter = StartCounter(r, settings)
    first, second = slots = _slots(step, 2)
    try:
        counter.count([first])
        host, port = counter._conn._sock.getsockname()[:2]
        assert r.client_kill(f"{host}:{port}")  # an idle timeout, a restart
        counter.count([second])
        deadline = time.monotonic() + 5
        while r.get(keys.deliveries(second)) is None:  # (written, not waited for)
            assert time.monotonic() < deadline, "the count after the close was lost"
            time.sleep(0.01)
        assert r.mget([keys.deliveries(s) for s in slots]) == [b"1", b"1"]
    finally:
        counter.close()
        _cleanup(r, slots)


def test_a_start_count_redis_refuses_is_logged(
    r: CountingRedis,
    step: str,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(starts, "UNREAD", 2)  # one count's replies are read at once
    counter = StartCounter(r, settings)
    slots = _slots(step, 1)
    try:
        r.set(keys.deliveries(slots[0]), b"not a number")
        with caplog.at_level(logging.WARNING, logger=starts.__name__):
            counter.count(slots)
        assert "Redis refused 1 task start count(s)" in caplog.text
        assert "not an integer" in caplog.text
    finally:
        counter.close()
        _cleanup(r, slots)


def test_claims_of_a_cancelled_run_are_all_refused(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    keeper = ClaimKeeper(r, settings)
    slots = _slots(step, 3)
    run_id = f"run-{uuid.uuid4().hex}"
    try:
        r.set(keys.cancel(run_id), 1)
        assert keeper.claim_many(slots, run_id, step) == [claims.CANCELLED] * 3
        assert r.mget([keys.claim(s) for s in slots]) == [None] * 3
    finally:
        r.delete(keys.cancel(run_id))
        _cleanup(r, slots)


def test_claims_of_a_step_that_is_over_are_all_refused(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    # A copy of a message that comes after its step ended (a poison task's included) runs
    # nothing and counts nothing: the step's end deleted the counts a retry starts from.
    keeper = ClaimKeeper(r, settings)
    slots = _slots(step, 3)
    try:
        r.delete(keys.step(step))
        assert keeper.claim_many(slots, "run", step) == [claims.CANCELLED] * 3
        assert r.mget([keys.claim(s) for s in slots]) == [None] * 3
        assert r.mget([keys.deliveries(s) for s in slots]) == [None] * 3
    finally:
        _cleanup(r, slots)


def test_many_claims_take_several_scripts_in_one_round_trip(
    r: CountingRedis, step: str, settings: Settings
) -> None:
    keeper = ClaimKeeper(r, settings)
    slots = _slots(step, claims.CLAIMS_PER_SCRIPT + 3)
    try:
        r.trips = 0
        pipe = r.pipeline(transaction=False)
        assert keeper.ask(pipe, slots, "run", step) == 2
        found = keeper.verdicts(slots, "run", step, keeper.answers(pipe.execute()))
        assert found == [1] * len(slots)
        assert r.trips == 1
    finally:
        _cleanup(r, slots)
