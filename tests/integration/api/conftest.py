"""A real cluster behind a real ``bulksync api``: three processes per test module.

``bulksync worker`` (threads pool), ``bulksync coordinator`` and ``bulksync api`` load
``tests.integration.api.graphs`` on a Postgres schema, a Celery queue and a port of their
own, and stop (SIGTERM, then the group is killed) when the module's tests are done. Each
process writes its log to the module's temporary directory; a process that exits or does not
get ready fails the test with its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bulksync.settings import Settings
from tests.integration.private_services import free_port
from tests.integration.test_worker_process import bulksync_command

GRAPHS = "tests.integration.api.graphs"
FANOUT = f"{GRAPHS}:fanout"
APPROVAL = f"{GRAPHS}:approval"
NESTED = f"{GRAPHS}:nested"
READY_WAIT = 60.0
ROOT = Path(__file__).resolve().parents[3]


@dataclasses.dataclass
class Process:
    """One ``bulksync`` process and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check(self) -> None:
        """Fail the test with the log if the process has exited."""
        if self.proc.poll() is not None:
            pytest.fail(
                f"bulksync {self.name} exited with {self.proc.returncode}:\n{self.output()}"
            )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL of its group if it does not stop in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclasses.dataclass
class ApiServer:
    """The API's URL, the settings of its cluster, and its processes."""

    url: str
    settings: Settings
    env: dict[str, str]
    processes: dict[str, Process]
    directory: Path

    def http(self, **kw: Any) -> httpx.Client:
        """A plain HTTP client of the API."""
        return httpx.Client(base_url=self.url, timeout=30, **kw)

    def sdk(self, **kw: Any) -> Any:
        """langgraph-sdk's sync client of the API."""
        from langgraph_sdk import get_sync_client

        return get_sync_client(url=self.url, api_key=kw.pop("api_key", None), **kw)

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Process:
        """Start ``bulksync name args`` with the cluster's environment (plus ``env``)."""
        log = self.directory / f"{name}-{uuid.uuid4().hex[:6]}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*bulksync_command(), name, *args],
                env={**self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so nothing leaks past the test
            )
        process = Process(name, proc, log)
        self.processes[f"{name}-{proc.pid}"] = process
        return process


def wait_for_http(process: Process, url: str, path: str = "/health") -> None:
    """Block until ``url + path`` answers 200; fail with the log if the process exits."""
    deadline = time.monotonic() + READY_WAIT
    while time.monotonic() < deadline:
        process.check()
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # a start-up wait, not a poll of the work under test
    pytest.fail(f"bulksync {process.name} did not answer {path}:\n{process.output()}")


def wait_served(server: ApiServer, coordinator: Process, graph_id: str) -> None:
    """Block until the coordinator announces ``graph_id``."""
    import redis

    from bulksync.service.events import serving

    client = redis.Redis.from_url(server.settings.redis_url)
    try:
        deadline = time.monotonic() + READY_WAIT
        while time.monotonic() < deadline:
            coordinator.check()
            if serving(client, graph_id):
                return
            time.sleep(0.1)  # a start-up wait
    finally:
        client.close()
    pytest.fail(f"the coordinator did not announce {graph_id}:\n{coordinator.output()}")


def wait_pinged(server: ApiServer, worker: Process, hostname: str) -> None:
    """Block until the worker ``hostname`` answers a Celery ping (it has booted)."""
    from bulksync.workers.celery.app import make_app

    app = make_app(server.settings)
    try:
        deadline = time.monotonic() + READY_WAIT
        while time.monotonic() < deadline:
            worker.check()
            if app.control.ping(destination=[hostname], timeout=0.5):
                return
    finally:
        app.close()
    pytest.fail(f"the worker {hostname} did not answer a ping:\n{worker.output()}")


@contextlib.contextmanager
def private_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    settings: Settings,
    database_url: str,
    name: str,
    **env: str,
) -> Iterator[ApiServer]:
    """An ``ApiServer`` with no process started yet, on a Postgres schema and a Celery queue of
    its own (``env``: more variables for its processes); its processes are stopped and its
    schema dropped afterwards."""
    import psycopg

    schema = f"t_{name}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in database_url else "?"
    schema_url = f"{database_url}{sep}options=-csearch_path%3D{schema}"
    queue = f"bulksync-test-{name}-{uuid.uuid4().hex[:8]}"
    server = ApiServer(
        url="",
        settings=dataclasses.replace(settings, queue=queue, database_url=schema_url),
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "BULKSYNC_QUEUE": queue,
            "BULKSYNC_BROKER_URL": settings.broker_url,
            "BULKSYNC_REDIS_URL": settings.redis_url,
            "BULKSYNC_DATABASE_URL": schema_url,
            "BULKSYNC_HEARTBEAT": "1",
            "BULKSYNC_POLL_INTERVAL": "1",
            **env,
        },
        processes={},
        directory=tmp_path_factory.mktemp(name),
    )
    try:
        yield server
    finally:
        for process in server.processes.values():
            process.stop()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="module")
def api_server(
    tmp_path_factory: pytest.TempPathFactory,
    settings: Settings,
    redis_url: str,
    database_url: str,
) -> Iterator[ApiServer]:
    with private_cluster(tmp_path_factory, settings, database_url, "api") as server:
        port = free_port()
        server.url = f"http://127.0.0.1:{port}"
        hostname = f"api-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        worker = server.start(
            "worker", "--graph", GRAPHS, "--pool", "threads", "--concurrency", "16",
            "--hostname", hostname,
        )  # fmt: skip
        coordinator = server.start("coordinator", "--graph", GRAPHS, "--loglevel", "WARNING")
        api = server.start("api", "--graph", GRAPHS, "--port", str(port), "--loglevel", "WARNING")
        wait_for_http(api, server.url)
        wait_served(server, coordinator, FANOUT)
        wait_pinged(server, worker, hostname)
        yield server


@pytest.fixture
def sdk(api_server: ApiServer) -> Iterator[Any]:
    """langgraph-sdk's sync client of the module's API (closed after the test)."""
    with api_server.sdk() as client:
        yield client


@pytest.fixture
def remote(api_server: ApiServer) -> Iterator[Any]:
    """Makes ``RemoteGraph(graph_id, url=...)`` of the module's API (closed after the test)."""
    from langgraph.pregel.remote import RemoteGraph

    made: list[Any] = []

    def make(graph_id: str) -> Any:
        graph = RemoteGraph(graph_id, url=api_server.url)
        made.append(graph)
        return graph

    yield make
    for graph in made:
        graph.sync_client.close()
