"""TaskStopper on a real Redis: a running task's async node is cancelled once its step or its
run is, and only then; other tasks of the process run on."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from bulksync import keys
from bulksync.workers.cancel_scope import run_coroutine
from bulksync.workers.celery.stopper import TaskStopper

pytestmark = pytest.mark.integration

WAIT = 10.0
"""Longest a test waits for a thread (a liveness bound, not a measure)."""


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def _sleeper(stopper: TaskStopper, step_key: str, run_id: str, seen: list[str]) -> threading.Thread:
    """A thread running, as a task of ``step_key``, an async node that sleeps a long time."""

    async def node() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    def task() -> None:
        with stopper.running(step_key, run_id):
            try:
                run_coroutine(node())
                seen.append("finished")
            except asyncio.CancelledError:
                seen.append("ended as cancelled")

    thread = threading.Thread(target=task, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "flag", [keys.step_cancel, keys.cancel], ids=["step cancelled", "run cancelled"]
)
def test_a_cancel_flag_stops_the_running_async_nodes_it_names(
    client: redis.Redis, flag: Callable[[str], str]
) -> None:
    stopper = TaskStopper(client, interval=0.05)
    step_key, run_id, other = (uuid.uuid4().hex for _ in range(3))
    seen: list[str] = []
    untouched: list[str] = []
    thread = _sleeper(stopper, step_key, run_id, seen)
    bystander = _sleeper(stopper, other, other, untouched)
    time.sleep(0.3)
    assert seen == [] and thread.is_alive()  # nothing cancelled: it runs on
    named = flag(step_key if flag is keys.step_cancel else run_id)
    client.set(named, 1, ex=60)
    try:
        thread.join(WAIT)
        assert not thread.is_alive()
        assert seen == ["cancelled", "ended as cancelled"]
        assert untouched == [] and bystander.is_alive()
    finally:
        client.set(keys.step_cancel(other), 1, ex=60)
        bystander.join(WAIT)
        client.delete(named, keys.step_cancel(other))


def test_an_unreachable_redis_leaves_the_tasks_running(caplog: Any) -> None:
    stopper = TaskStopper(redis.Redis.from_url("redis://127.0.0.1:1/0"), interval=0.05)
    seen: list[str] = []
    thread = _sleeper(stopper, "step", "run", seen)
    time.sleep(0.3)
    assert seen == [] and thread.is_alive()
    assert "could not look for cancelled steps" in caplog.text
    for scope in [s for _, s in list(stopper._running.values())]:
        scope.cancel()  # end the sleeper: the test's own stop, not the stopper's
    thread.join(WAIT)
