"""The same cluster over RabbitMQ: the broker is chosen by URL alone."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from celery.contrib.testing.worker import start_worker

from bulksync.coordinator.celery_executor import CeleryExecutor
from bulksync.demo import build_demo_graph, demo_input
from bulksync.settings import Settings
from bulksync.workers.app import make_app
from bulksync.workers.node_task import WorkerRuntime, install
from bulksync.workers.registry import GraphRegistry


def test_a_fan_out_runs_over_rabbitmq(
    settings: Settings, redis_url: str, rabbitmq_url: str
) -> None:
    amqp = dataclasses.replace(
        settings, broker_url=rabbitmq_url, queue=f"bulksync-test-{uuid.uuid4().hex[:8]}"
    )
    app = make_app(amqp)
    graph = build_demo_graph().compile()
    registry = GraphRegistry()
    registry.add("tests.rabbitmq:graph", graph)
    install(app, WorkerRuntime(registry, amqp.redis_url))
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=[amqp.queue],
        shutdown_timeout=60,
    ):
        executor = CeleryExecutor(amqp, "tests.rabbitmq:graph", graph, app=app)
        out: dict[str, Any] = graph.with_executor(executor).invoke(demo_input(12))
    assert out == graph.invoke(demo_input(12))
    assert len(out["jokes"]) == 12
