"""Fixtures shared by every test suite; suite-specific ones live next to their tests.

Service fixtures talk to real Redis, Postgres and Celery workers. A service that cannot be
reached skips the tests that need it on a developer's machine, and fails them when ``CI`` is
set (``.ci/run`` starts every service first, so a missing one there is a real failure).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bulksync.settings import Settings

if TYPE_CHECKING:
    import redis


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty ``BULKSYNC_HOME`` for this test, so no test touches ``~/.bulksync``."""
    home = tmp_path / "bulksync-home"
    monkeypatch.setenv("BULKSYNC_HOME", str(home))
    return home


def require_service(name: str, check: Callable[[], object]) -> None:
    """Run ``check``; skip the test (fail under ``CI``) when it raises."""
    try:
        check()
    except Exception as exc:  # any failure to connect means "not available here"
        message = f"{name} is not reachable ({type(exc).__name__}: {exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; .ci/run should have started it", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def settings() -> Settings:
    """Service URLs from ``BULKSYNC_*`` variables, defaulting to the local services."""
    env = dict(os.environ)
    env.setdefault("BULKSYNC_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    return Settings.from_env(env)


@pytest.fixture(scope="session")
def redis_url(settings: Settings) -> str:
    """The Redis URL, once Redis answers a PING."""
    import redis

    def ping() -> None:
        with redis.Redis.from_url(settings.redis_url, socket_connect_timeout=2) as client:
            client.ping()

    require_service("Redis", ping)
    return settings.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the Redis at ``redis_url``, closed when the test ends."""
    import redis

    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """A RabbitMQ broker URL (``BULKSYNC_TEST_AMQP_URL``), once its port accepts a connection."""
    import socket
    from urllib.parse import urlsplit

    url = os.environ.get("BULKSYNC_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
    parts = urlsplit(url)

    def connect() -> None:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2).close()

    require_service("RabbitMQ", connect)
    return url


@pytest.fixture(scope="session")
def database_url(settings: Settings) -> str:
    """The Postgres URL, once Postgres accepts a connection."""
    import psycopg

    def connect() -> None:
        psycopg.connect(settings.database_url, connect_timeout=2).close()

    require_service("Postgres", connect)
    return settings.database_url


@pytest.fixture
def pg_schema(database_url: str) -> Iterator[str]:
    """A connection URL whose ``search_path`` is a fresh schema, dropped after the test."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in database_url else "?"
    yield f"{database_url}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


class Cluster:
    """An in-process Celery worker (thread pool) serving graphs registered while it runs."""

    def __init__(self, settings: Settings, app: Any, runtime: Any, worker: Any) -> None:
        self.settings = settings
        self.app = app
        self.runtime = runtime
        self.worker = worker
        self.executors: list[Any] = []  # made for the running test (executor())

    def register(self, graph: Any, graph_id: str | None = None) -> str:
        """Serve ``graph`` (under a fresh id unless given); return its id."""
        from bulksync.workers.celery.node_task import install

        graph_id = graph_id or f"tests.graph_{uuid.uuid4().hex[:10]}:graph"
        if graph_id not in self.runtime.registry:
            self.runtime.registry.add(graph_id, graph)
            install(self.app, self.runtime)
            self.worker.consumer.update_strategies()
        return graph_id

    def attach(self, graph: Any, graph_id: str | None = None, **kw: Any) -> Any:
        """``graph`` bound to a Celery executor whose tasks this worker runs."""
        return graph.with_executor(self.executor(self.register(graph, graph_id), graph, **kw))

    def executor(
        self, graph_id: str, graph: Any, settings: Settings | None = None, **kw: Any
    ) -> Any:
        """A Celery executor of ``graph`` on this worker's app (with the cluster's settings
        unless given), closed when the test ends."""
        from bulksync.workers.celery.executor import CeleryExecutor

        settings = settings or self.settings
        executor = CeleryExecutor(settings, graph_id, graph, app=self.app, **kw)
        self.executors.append(executor)
        return executor

    def close_executors(self) -> None:
        """Close the executors made for the test (``_executors_closed``)."""
        while self.executors:
            self.executors.pop().close()


@pytest.fixture(autouse=True)
def _executors_closed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Close the executors the cluster made for a test once it ends: their Redis sockets,
    left to garbage collection, would warn then and fail whichever test runs at the time."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").close_executors()


@pytest.fixture(scope="session")
def cluster(settings: Settings, redis_url: str) -> Iterator[Cluster]:
    """A Celery worker thread pool in this process, on the local Redis broker."""
    from celery.contrib.testing.worker import start_worker

    from bulksync.workers.celery.app import make_app
    from bulksync.workers.celery.node_task import WorkerRuntime, install
    from bulksync.workers.registry import GraphRegistry

    # Queues of their own, so test runs sharing a Redis never take each other's messages.
    settings = dataclasses.replace(settings, queue=f"bulksync-test-{uuid.uuid4().hex[:8]}")
    app = make_app(settings)
    runtime = WorkerRuntime(GraphRegistry(), settings)
    install(app, runtime)  # a message before the first register() still finds the runtime
    with start_worker(
        app,
        pool="threads",
        concurrency=8,
        perform_ping_check=False,
        loglevel="WARNING",
        queues=[settings.queue, f"{settings.queue}-special"],
        shutdown_timeout=30,
    ) as worker:
        yield Cluster(settings, app, runtime, worker)
