"""The same cluster over RabbitMQ: the broker is chosen by URL alone.

The worker is a `bulksync worker` subprocess: stopping an in-process Celery worker resets
Celery's process-wide shutdown state, which would stop the session's shared test worker.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bulksync.demo import demo_input, graph
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor


@pytest.fixture
def amqp_settings(settings: Settings, redis_url: str, rabbitmq_url: str) -> Settings:
    return dataclasses.replace(
        settings, broker_url=rabbitmq_url, queue=f"bulksync-test-{uuid.uuid4().hex[:8]}"
    )


@pytest.fixture
def amqp_worker(amqp_settings: Settings) -> Iterator[Any]:
    """A `bulksync worker --graph bulksync.demo` on RabbitMQ; yields its Celery app."""
    env = {
        **os.environ,
        "BULKSYNC_BROKER_URL": amqp_settings.broker_url,
        "BULKSYNC_REDIS_URL": amqp_settings.redis_url,
        "BULKSYNC_QUEUE": amqp_settings.queue,
    }
    name = f"amqp-{uuid.uuid4().hex[:6]}@localhost"
    argv = [sys.executable, "-m", "bulksync.cli", "worker", "--graph", "bulksync.demo"]
    argv += ["--pool", "threads", "--concurrency", "4", "--hostname", name]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    app = make_app(amqp_settings)
    try:
        for _ in range(60):
            if app.control.ping(destination=[name], timeout=0.5):
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        else:
            pytest.fail("the RabbitMQ worker did not answer a ping within 30 s")
        yield app
    finally:
        proc.terminate()
        proc.communicate(timeout=60)  # also closes its stderr pipe


def test_a_fan_out_runs_over_rabbitmq(amqp_settings: Settings, amqp_worker: Any) -> None:
    with CeleryExecutor(amqp_settings, "bulksync.demo:graph", graph, app=amqp_worker) as executor:
        out: dict[str, Any] = graph.with_executor(executor).invoke(demo_input(12))
    assert out == graph.invoke(demo_input(12))
    assert len(out["jokes"]) == 12
