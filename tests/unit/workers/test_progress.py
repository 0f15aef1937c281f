"""The progress chunk of a Celery step, and the progress line the CLI makes of it."""

from __future__ import annotations

from typing import Any

from bulksync.cli.cluster import progress_text
from bulksync.coordinator.plan import Task
from bulksync.workers.celery.claims import Survey
from bulksync.workers.celery.progress import progress_chunk, waiting_queues


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name


TASKS: dict[str, Any] = {
    "a1": _Task("embed"),
    "a2": _Task("embed"),
    "b1": _Task("rank"),
    "c1": _Task("summarize"),
}
QUEUES = {"embed": "gpu", "rank": "gpu", "summarize": "default"}


def queue_of(task: Task) -> str:
    return QUEUES[task.name]


def test_queues_are_reported_once_their_tasks_waited_long_enough() -> None:
    found = Survey([], [], {}, queued={"a1": 40.0, "a2": 35.0, "b1": 31.0, "c1": 5.0})
    [gpu] = waiting_queues(found, TASKS, queue_of, after=30.0)
    assert (gpu.queue, gpu.nodes, gpu.tasks, gpu.seconds) == ("gpu", ("embed", "rank"), 3, 40.0)
    assert waiting_queues(found, TASKS, queue_of, after=60.0) == []


def test_the_chunk_counts_tasks_per_worker_process_and_per_node() -> None:
    found = Survey(
        [],
        [],
        {},
        queued={"c1": 2.0},
        running={"a1": ("h1:10:ab", 3.0), "a2": ("h1:10:ab", 7.5), "b1": ("h2:7:cd", 1.0)},
    )
    chunk = progress_chunk(4, TASKS, 0, found, [])
    assert chunk == {
        "step": 4,
        "total": 4,
        "done": 0,
        "queued": 1,
        "running": 3,
        "nodes": {
            "summarize": {"queued": 1, "running": 0},
            "embed": {"queued": 0, "running": 2},
            "rank": {"queued": 0, "running": 1},
        },
        "workers": {
            "h1:10": {"tasks": 2, "longest_s": 7.5},
            "h2:7": {"tasks": 1, "longest_s": 1.0},
        },
        "waiting": [],
    }
    line = progress_text(chunk)
    assert line == "step 4 · tasks 0/4 · 1 queued · 3 running on 2 workers (longest 8s)"


def test_the_line_before_the_coordinator_looked_is_the_counts_alone() -> None:
    assert progress_text({"step": 2, "done": 3, "total": 10}) == "step 2 · tasks 3/10"
