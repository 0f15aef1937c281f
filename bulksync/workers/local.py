"""The in-process executor: a step's tasks on a thread pool of this process.

Send fan-out really runs in parallel here (up to ``max_concurrency`` threads); async nodes
run on a private event loop in their thread. Results are delivered as tasks finish.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from bulksync.coordinator.executor import StepInput, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.workers.execute import run_task


def default_concurrency() -> int:
    """Python's default thread count for I/O-bound work (as LangGraph gets by default)."""
    return min(32, (os.cpu_count() or 1) + 4)


class LocalStep:
    """A step running on the pool."""

    def __init__(self, futures: list[Future[None]]) -> None:
        self._futures = futures

    def cancel(self) -> None:
        """Cancel the tasks that have not started."""
        for fut in self._futures:
            fut.cancel()


class LocalExecutor:
    """Runs tasks on threads; one pool per executor, shared by nested subgraph loops.

    ``max_concurrency`` bounds the threads of one step (``config["max_concurrency"]``);
    nested steps get their own slots, so a subgraph never waits for its parent's threads.
    """

    def __init__(self, max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency or default_concurrency()

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> LocalStep:
        """Start ``tasks`` on a pool of at most ``max_concurrency`` threads."""
        workers = max(1, min(self.max_concurrency, len(tasks)))
        pool = ThreadPoolExecutor(workers, thread_name_prefix=f"bulksync-{spec.name}")
        remaining = [len(tasks)]
        lock = threading.Lock()

        def one(task: Task) -> None:
            try:
                deliver(run_task(spec, task, step))
            finally:
                with lock:
                    remaining[0] -= 1
                    done = remaining[0] == 0
                if done:
                    pool.shutdown(wait=False)

        futures = [pool.submit(one, t) for t in tasks]
        return LocalStep(futures)
