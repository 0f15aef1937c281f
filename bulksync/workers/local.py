"""The in-process executor: a step's tasks on a thread pool of this process.

Send fan-out really runs in parallel here (up to ``max_concurrency`` threads); a step's
lone sync task runs on the thread that drives the run (``invoke``'s caller's), as on
LangGraph (``StepLive.lone``); async nodes run on the async caller's event loop (else on a
private one in their thread), cancelled when their step is (a caller breaking off the
stream, a sibling failing). Results are delivered as tasks finish.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from bulksync.coordinator.executor import StepInput, StepLive, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import ConfigError, TaskCancelledError
from bulksync.workers.cancel_scope import CancelScope, usable_home, within
from bulksync.workers.execute import run_task

logger = logging.getLogger(__name__)


@functools.cache
def default_concurrency() -> int:
    """Python's default thread count for I/O-bound work (as LangGraph gets by default);
    counted once per process (a worker makes an executor per message)."""
    return min(32, (os.cpu_count() or 1) + 4)


class LocalStep:
    """A step running on the pool."""

    def __init__(
        self,
        futures: dict[str, Future[None]],
        deliver: Callable[[TaskResult], None],
        scope: CancelScope,
    ) -> None:
        self._futures = futures
        self._deliver = deliver
        self._scope = scope

    def cancel(self) -> None:
        """Cancel the tasks that have not started, and the async nodes (and the runs they
        invoke) that are running; a running sync node cannot be stopped, it finishes."""
        for task_id, fut in self._futures.items():
            if fut.cancel():
                self._deliver(TaskResult(task_id, error=TaskCancelledError(task_id)))
        self._scope.cancel()


class LocalExecutor:
    """Runs each step's tasks on a thread pool of this process.

    A step gets at most ``config["max_concurrency"]`` threads (also read from
    ``configurable``), else this executor's ``max_concurrency``; nested subgraph steps get
    pools of their own, so a subgraph never waits for its parent's threads.
    """

    def __init__(self, max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency or default_concurrency()

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        live: StepLive,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> LocalStep:
        """Start ``tasks`` on a pool bounded by the run's ``max_concurrency``.

        Without that bound, the tasks of async nodes an async caller's loop runs all start
        at once, as on LangGraph (their threads only wait for that loop), and the others
        share a pool of this executor's size."""
        # The caller's event loop runs the async nodes, unless this thread is blocked on it.
        scope = CancelScope(home=usable_home(live.home))
        bound = step_concurrency(step.config, 0)
        on_loop = (
            [] if bound or scope.home is None else [t for t in tasks if spec.nodes[t.name].is_async]
        )
        ids = {t.id for t in on_loop}
        rest = [t for t in tasks if t.id not in ids]

        def one(task: Task) -> None:
            try:
                with within(scope):
                    result = run_task(spec, task, step, live)
            except BaseException as exc:  # a bug of bulksync's: the step must still end
                logger.exception("task %s (%s) failed outside its node", task.id, task.name)
                result = TaskResult(task.id, error=exc)
            deliver(result)

        # A lone sync task runs here: no thread to start and hand it to, a sequential step's
        # main cost. (The run's thread never runs an event loop; one there must not block.)
        lone = live.lone and len(rest) == 1 and not spec.nodes[rest[0].name].is_async
        if lone and not _in_event_loop():
            one(rest[0])
            return LocalStep({}, deliver, scope)
        futures: dict[str, Future[None]] = {}
        for group, size in ((on_loop, len(on_loop)), (rest, bound or self.max_concurrency)):
            if not group:
                continue
            workers = max(1, min(size, len(group)))
            pool = ThreadPoolExecutor(workers, thread_name_prefix=f"bulksync-{spec.name}")
            futures.update((t.id, pool.submit(one, t)) for t in group)
            # Queued tasks still run after shutdown(wait=False); the threads exit once done.
            pool.shutdown(wait=False)
        return LocalStep(futures, deliver, scope)


def _in_event_loop() -> bool:
    """Whether this thread is running an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def step_concurrency(config: Mapping[str, Any], default: int) -> int:
    """The thread bound a run asks for (``max_concurrency``, top level or configurable).

    Raises:
        ConfigError: a bound that is not a positive integer (a ``ValueError``).
    """
    value = config.get("max_concurrency")
    if value is None:
        value = (config.get("configurable") or {}).get("max_concurrency")
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"max_concurrency must be an integer >= 1, got {value!r}.")
    return value
