"""Where a dispatched step's tasks are: the ``progress`` chunk a Celery step streams.

Every claim heartbeat the step's :class:`~bulksync.workers.celery.claims.ClaimWatch` looks at
the claims of its unfinished tasks; from that look this module says how many tasks are
queued, which workers run the others (and for how long), how many are done — and which
queues hold tasks that have waited longer than ``Settings.queue_wait_warning`` without any
worker taking them, the usual sign of a node routed to a queue no worker consumes. The run's
progress stream and ``bulksync submit --wait`` show the chunk; the coordinator logs the
waiting queues.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from bulksync import logs
from bulksync.coordinator.plan import Task
from bulksync.workers.celery.claims import Survey

log = logging.getLogger("bulksync.workers.celery.executor")  # the step's own logger


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """Tasks of one queue that have waited too long for a worker."""

    queue: str
    nodes: tuple[str, ...]
    tasks: int
    seconds: float

    def chunk(self) -> dict[str, Any]:
        """As the progress chunk lists it."""
        return {
            "queue": self.queue,
            "nodes": list(self.nodes),
            "tasks": self.tasks,
            "seconds": round(self.seconds, 1),
        }


def waiting_queues(
    found: Survey, tasks: Mapping[str, Task], queue_of: Callable[[Task], str], after: float
) -> list[Waiting]:
    """The queues whose tasks have waited ``after`` seconds or more unstarted, by queue name."""
    by_queue: dict[str, list[str]] = collections.defaultdict(list)
    for task_id, age in found.queued.items():
        if age >= after:
            by_queue[queue_of(tasks[task_id])].append(task_id)
    return [
        Waiting(
            queue,
            tuple(sorted({tasks[t].name for t in ids})),
            len(ids),
            max(found.queued[t] for t in ids),
        )
        for queue, ids in sorted(by_queue.items())
    ]


def warn_waiting(
    waiting: list[Waiting], warned: set[str], graph_id: str, run_id: str, thread: str, step: int
) -> None:
    """Warn once per queue (``warned`` holds those done) whose tasks wait for a worker."""
    for late in waiting:
        if late.queue in warned:
            continue
        warned.add(late.queue)
        log.warning(
            "run %s thread %s: step %d: %d tasks of %s have waited %.0fs on queue %r "
            "and no worker has started them; is a worker consuming that queue "
            "(bulksync worker --graph %s --queues %s)?",
            run_id or "-",
            thread or "-",
            step,
            late.tasks,
            ", ".join(late.nodes),
            late.seconds,
            late.queue,
            graph_id,
            late.queue,
            extra=logs.ids(run_id=run_id, thread_id=thread, step=step),
        )


def progress_chunk(
    step: int,
    tasks: Mapping[str, Task],
    done: int,
    found: Survey,
    waiting: list[Waiting],
) -> dict[str, Any]:
    """The ``progress`` chunk of a step: counts (also per node: ``nodes``), the workers
    running its tasks (a worker is its claim holder's ``host:pid``) with the longest a task
    has run there, and the waiting queues."""
    nodes: dict[str, dict[str, int]] = {}
    for state, ids in (("queued", found.queued), ("running", found.running)):
        for task_id in ids:
            counts = nodes.setdefault(tasks[task_id].name, {"queued": 0, "running": 0})
            counts[state] += 1
    workers: dict[str, dict[str, Any]] = {}
    for holder, seconds in found.running.values():
        host, _, rest = holder.partition(":")
        name = f"{host}:{rest.partition(':')[0]}"
        seen = workers.setdefault(name, {"tasks": 0, "longest_s": 0.0})
        seen["tasks"] += 1
        seen["longest_s"] = max(seen["longest_s"], round(seconds, 1))
    return {
        "step": step,
        "total": len(tasks),
        "done": done,
        "queued": len(found.queued),
        "running": len(found.running),
        "nodes": nodes,
        "workers": workers,
        "waiting": [w.chunk() for w in waiting],
    }
