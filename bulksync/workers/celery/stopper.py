"""Stopping the running tasks of a cancelled step or run on a worker.

A coordinator cancels a step when one of its tasks fails, when it outruns its
``step_timeout``, or when the caller stops reading the run; a run is cancelled as a whole
(``bulksync cancel``, a cancelled ``RemoteGraph`` call). Revoking the step's messages keeps
its tasks from starting, but a task already running would go on: so each worker process
runs the tasks of a message it took under one ``CancelScope`` (they belong to one step of
one run), and a ``TaskStopper`` thread looks, every ``cancel_poll`` seconds while tasks
run, whether their step or run was cancelled (one Redis round trip for all of them). It
cancels the scope of each such message: its async nodes (and ``@task`` coroutines) see
``CancelledError`` at their next ``await`` and its tasks end as cancelled, as in-process.
One scope a message, not a task: a worker with thousands of async tasks in flight watches
a few dozen scopes. A sync node cannot be interrupted; it finishes, and its result is
not used.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import redis

from bulksync import keys
from bulksync.workers.cancel_scope import CancelScope, within

log = logging.getLogger(__name__)


class TaskStopper:
    """The running tasks of one worker process, by the cancel flags that stop them."""

    def __init__(self, client: redis.Redis, interval: float) -> None:
        self.redis = client
        self.interval = interval
        self._running: dict[int, tuple[tuple[str, str], CancelScope]] = {}
        self._lock = threading.Lock()
        self._watching = False

    @contextlib.contextmanager
    def running(self, step_key: str, run_id: str) -> Iterator[CancelScope]:
        """Run the block — the tasks of one message of ``step_key`` (of run ``run_id``) —
        under a scope that is cancelled once either is."""
        scope = CancelScope()
        flags = (keys.step_cancel(step_key), keys.cancel(run_id))
        with self._lock:
            self._running[id(scope)] = (flags, scope)
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, name="bulksync-stopper", daemon=True).start()
        try:
            with within(scope):
                yield scope
        finally:
            with self._lock:
                del self._running[id(scope)]

    def _watch(self) -> None:
        while True:
            time.sleep(self.interval)  # the look's period, only while tasks run
            with self._lock:
                running = list(self._running.values())
            if running:
                self._look(running)

    def _look(self, running: list[tuple[tuple[str, str], CancelScope]]) -> None:
        flags = sorted({flag for watched, _ in running for flag in watched})
        try:
            pipe = self.redis.pipeline(transaction=False)
            for flag in flags:
                pipe.exists(flag)
            raised = {flag for flag, on in zip(flags, pipe.execute(), strict=True) if on}
        except redis.RedisError as exc:  # the next look tries again
            log.warning("could not look for cancelled steps: %s", exc)
            return
        for watched, scope in running:
            if not scope.cancelled and raised.intersection(watched):
                # cancel() waits for the coroutines to end: not on this thread's time.
                threading.Thread(target=scope.cancel, name="bulksync-stop", daemon=True).start()
