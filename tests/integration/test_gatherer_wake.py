"""The gatherer's wake-up list on a real Redis: it ends a wait, never a turn of reports."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis

from bulksync import keys
from bulksync.settings import Settings
from bulksync.workers.celery.gatherer import Gatherer


class Step:
    """A step in flight as the gatherer sees it, noting what it receives."""

    def __init__(self) -> None:
        self.inbox = keys.inbox(f"test-{uuid.uuid4().hex}")
        self.last_seen = time.monotonic()
        self.got: list[bytes] = []

    def receive(self, entries: Sequence[bytes]) -> None:
        self.got.extend(entries)

    def is_open(self) -> bool:
        return True

    def wait_hint(self) -> float:
        return 1.0

    def expire(self) -> None:
        pass

    def ask_claims(self, pipe: Any) -> bool:
        return False

    def heard_claims(self, replies: list[Any]) -> None:
        pass

    def probe(self, pipe: Any) -> None:
        pass

    def settle(self, replies: list[Any]) -> None:
        pass

    def drop_keys(self, pipe: Any) -> None:
        pass


def test_a_queued_wake_up_never_takes_a_turn_from_reports(
    redis_client: redis.Redis, settings: Settings
) -> None:
    gatherer, step = Gatherer(redis_client, settings), Step()
    gatherer._steps[step.inbox] = step  # gathered, its thread not started: turns run here
    redis_client.rpush(gatherer.wake_key, b"1")  # a step joined while the gatherer was busy
    redis_client.rpush(step.inbox, b"first", b"second")
    try:
        gatherer._turn_once([step], time.monotonic() + 1)
        assert step.got == [b"first", b"second"]  # the reports first
        assert redis_client.llen(gatherer.wake_key) == 1
        gatherer._turn_once([step], time.monotonic() + 1)  # nothing else: the wake-up goes
        assert step.got == [b"first", b"second"]
        assert redis_client.llen(gatherer.wake_key) == 0
    finally:
        redis_client.delete(step.inbox, gatherer.wake_key)
