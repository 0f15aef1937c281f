"""A step's progress on the cluster: where its tasks are, and queues no worker takes from.

A run whose node is routed to a queue that no worker consumes used to wait without a word.
Now the coordinator's claim survey reports it: the run's progress events say which queue
holds how many tasks and for how long, ``bulksync submit --wait`` shows it on its progress
line, and the coordinator logs a warning naming the queue and the command that would serve
it — once per queue, however long the wait.
"""

from __future__ import annotations

import logging
import operator
import time
import uuid
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.cli.cluster import progress_text
from bulksync.graph import END, START, StateGraph
from bulksync.service import events, runs
from bulksync.types import Send

from .test_service import WAIT, Service
from .test_service import service as service  # the fixture

pytestmark = pytest.mark.integration


class Work(TypedDict, total=False):
    items: list[int]
    done: Annotated[list[int], operator.add]


def stranded_graph(queue: str) -> Any:
    """``prepare`` runs on the served queue; its ``work`` fan-out goes to ``queue``."""
    builder = StateGraph(Work)
    builder.add_node("prepare", lambda s: {"done": []})
    builder.add_node("work", lambda task: {"done": [task["i"]]}, queue=queue)
    builder.add_edge(START, "prepare")
    builder.add_conditional_edges(
        "prepare", lambda s: [Send("work", {"i": i}) for i in s["items"]], ["work"]
    )
    builder.add_edge("work", END)
    return builder.compile()


def test_tasks_on_a_queue_nobody_consumes_are_reported(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    nobody = f"bulksync-test-nobody-{uuid.uuid4().hex[:8]}"
    graph_id = service.register(stranded_graph(nobody))
    service.start(claim_heartbeat=0.2, queue_wait_warning=0.5)
    caplog.set_level(logging.WARNING, logger="bulksync")
    run_id = service.client.submit(graph_id, {"items": [1, 2, 3]})

    waiting: dict[str, Any] | None = None
    deadline = time.monotonic() + WAIT
    for event in service.client.stream(run_id):
        assert time.monotonic() < deadline, "no progress event named the waiting queue"
        if event.mode == events.PROGRESS and event.chunk.get("waiting"):
            waiting = event.chunk
            break
    assert waiting is not None
    assert waiting["step"] == 2 and waiting["total"] == 3 and waiting["done"] == 0
    assert waiting["queued"] == 3 and waiting["running"] == 0
    [late] = waiting["waiting"]
    assert (late["queue"], late["nodes"], late["tasks"]) == (nobody, ["work"], 3)
    assert late["seconds"] >= 0.5
    line = progress_text(waiting)
    assert "3 waiting" in line and repr(nobody) in line, line

    # The coordinator said so once, naming the run, the queue and how to serve it.
    time.sleep(1.0)  # several more surveys: still one warning
    warnings = [r.getMessage() for r in caplog.records if nobody in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert run_id in warnings[0] and f"--queues {nobody}" in warnings[0]
    assert service.client.get(run_id).status == runs.RUNNING
    service.client.cancel(run_id)
    assert service.client.wait(run_id, timeout=WAIT).status == runs.CANCELLED


def test_progress_of_a_long_step_names_its_workers(service: Service) -> None:
    """While tasks run, the progress says how many and on which workers, for how long."""
    gate = service.gate("long")

    def slow(task: dict[str, Any]) -> Work:
        gate()
        return {"done": [task["i"]]}

    builder = StateGraph(Work)
    builder.add_node("prepare", lambda s: {"done": []})
    builder.add_node("slow", slow)
    builder.add_edge(START, "prepare")
    builder.add_conditional_edges(
        "prepare", lambda s: [Send("slow", {"i": i}) for i in s["items"]], ["slow"]
    )
    builder.add_edge("slow", END)
    graph_id = service.register(builder.compile())
    service.start(claim_heartbeat=0.2)
    run_id = service.client.submit(graph_id, {"items": [1, 2]})

    seen: dict[str, Any] | None = None
    for event in service.client.stream(run_id):
        if event.mode == events.PROGRESS and event.chunk.get("running") == 2:
            seen = event.chunk
            break
    assert seen is not None
    assert seen["queued"] == 0 and seen["waiting"] == []
    assert sum(w["tasks"] for w in seen["workers"].values()) == 2
    service.open_gate("long", times=2)
    run = service.client.wait(run_id, timeout=WAIT)
    assert run.status == runs.SUCCESS and sorted(run.output["done"]) == [1, 2]
