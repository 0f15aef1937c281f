"""The gatherer's wake-up list on a real Redis: it ends a wait, never a turn of reports."""

from __future__ import annotations

import time
import uuid

import redis

from bulksync import keys
from bulksync.settings import Settings
from bulksync.workers.celery.gatherer import Gatherer
from tests.unit.workers.test_gatherer import FakeStep


def test_a_queued_wake_up_never_takes_a_turn_from_reports(
    redis_client: redis.Redis, settings: Settings
) -> None:
    gatherer = Gatherer(redis_client, settings)
    step = FakeStep(keys.inbox(f"test-{uuid.uuid4().hex}"), owed=3)  # open after two reports
    gatherer._steps[step.inbox] = step  # gathered, its thread not started: turns run here
    redis_client.rpush(gatherer.wake_key, b"1")  # a step joined while the gatherer was busy
    redis_client.rpush(step.inbox, b"first", b"second")
    try:
        gatherer._turn_once([step], time.monotonic() + 1)
        assert step.received == [b"first", b"second"]  # the reports first
        assert redis_client.llen(gatherer.wake_key) == 1
        gatherer._turn_once([step], time.monotonic() + 1)  # nothing else: the wake-up goes
        assert step.received == [b"first", b"second"]
        assert redis_client.llen(gatherer.wake_key) == 0
    finally:
        redis_client.delete(step.inbox, gatherer.wake_key)
