"""The gatherer's one inbox on a real Redis: every step's reports come on one list."""

from __future__ import annotations

import dataclasses
import time

import redis

from bulksync import keys
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.celery.gatherer import Gatherer
from tests.unit.workers.test_gatherer import FakeStep

WAIT = 10.0
"""Longest a test waits for a report (a liveness bound)."""


def test_a_step_joining_a_blocked_gatherer_gets_its_reports_without_waiting_out_the_block(
    redis_client: redis.Redis, settings: Settings
) -> None:
    idle_wait = 4.0  # the longest block: a report waiting for it would come this late
    gatherer = Gatherer(redis_client, dataclasses.replace(settings, idle_wait=idle_wait))
    first = FakeStep(gatherer, owed=2)
    gatherer.add(first)
    try:
        time.sleep(0.2)  # the thread blocks on the inbox
        joined = FakeStep(gatherer, owed=2)
        gatherer.add(joined)
        began = time.monotonic()
        # Interleaved, as workers of both steps push them: each step gets its own, in order.
        redis_client.rpush(
            keys.inbox(joined.key),
            wire.addressed(joined.key, b"j1"),
            wire.addressed(first.key, b"f1"),
            wire.addressed(joined.key, b"j2"),
        )
        assert joined.closed.wait(WAIT)
        assert time.monotonic() - began < idle_wait / 2  # not at the block's end
        assert joined.received == [b"j1", b"j2"]
        assert first.received == [b"f1"]
        assert keys.inbox(joined.key) == keys.inbox(first.key) == gatherer.inbox
    finally:
        first.closed.set()
        assert gatherer.join(WAIT)
        redis_client.delete(gatherer.inbox)
