"""CancelScope: coroutines and runs stopped together, from any thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bulksync.workers.cancel_scope import CancelScope, current_scope, run_coroutine, within


def test_cancel_reaches_a_coroutine_running_on_another_thread() -> None:
    scope = CancelScope()
    started = threading.Event()
    outcome: list[str] = []

    async def sleeper() -> None:
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    def run() -> None:
        with pytest.raises(asyncio.CancelledError):
            scope.run(sleeper())

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(2)
    t0 = time.monotonic()
    scope.cancel()
    thread.join(2)
    assert outcome == ["cancelled"] and time.monotonic() - t0 < 1


def test_after_cancel_new_work_starts_cancelled_and_stops_run_at_once() -> None:
    scope = CancelScope()
    scope.cancel()
    stopped: list[str] = []
    scope.on_cancel(lambda: stopped.append("run"))
    assert stopped == ["run"]
    with pytest.raises(asyncio.CancelledError):
        scope.run(asyncio.sleep(5))


def test_run_coroutine_uses_the_callers_scope() -> None:
    scope = CancelScope()
    with within(scope):
        assert current_scope() is scope
        assert run_coroutine(asyncio.sleep(0, result=3)) == 3
    assert current_scope() is None
