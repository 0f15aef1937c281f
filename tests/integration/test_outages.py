"""Riding through a Postgres outage and a Redis restart mid-run (issue 8, items 3 and 11).

Real processes: ``bulksync worker`` subprocesses (thread pools) on a private queue and one
``bulksync coordinator``, against a *private* Postgres cluster (``initdb``/``pg_ctl``) or a
*private* ``redis-server`` that the test stops and starts — never the shared services.

The graph is a chain into a fan-out and out again: ``prepare`` → ``WIDTH`` ``work`` tasks →
``total``. Every node counts its starts and finishes in the shared Redis (not the private
one, which goes away). The tasks of the node named by the run's input (``gated``) wait for a
gate, so the outage begins while they run, without relying on timing: the test waits until
they all started, takes the service down, opens the gate (they finish while it is down),
and brings it back. The run must succeed with the output of an undisturbed in-process run,
every task must have finished exactly once, and every process must still be alive.
"""

from __future__ import annotations

import importlib
import os
import queue
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bulksync.client import Client
from bulksync.service import events, runs
from bulksync.settings import Settings
from tests.integration.private_services import PrivatePostgres, PrivateRedis
from tests.integration.test_coordinator_faults import Proc, spawn, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WIDTH = 4
"""``work`` tasks per run."""

OUTAGE = 5.0
"""Seconds the service stays down."""

WAIT = 90.0
"""Longest wait for any one thing (a liveness bound, not a measure)."""

GRAPH_MODULE = '''
"""Chain, fan-out, chain; instrumented when BULKSYNC_TEST_COUNTS is set (in the workers)."""

import operator
import os
import time
from typing import Annotated, Any, TypedDict

import redis

from bulksync.graph import END, START, StateGraph
from bulksync.types import Send

WIDTH = 4
_clients: dict[int, redis.Redis] = {}


class State(TypedDict, total=False):
    tag: str
    gated: str
    done: Annotated[list[int], operator.add]
    total: int


def client() -> redis.Redis:
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = redis.Redis.from_url(os.environ["BULKSYNC_TEST_COUNTS_URL"])
    return _clients[pid]


def visit(tag: str, gated: bool, *parts: object) -> None:
    """Count a start, wait for the gate if gated, count a finish."""
    prefix = os.environ.get("BULKSYNC_TEST_COUNTS")
    if not prefix:
        return
    name = ":".join([prefix, tag, *map(str, parts)])
    client().incr(name + ":starts")
    deadline = time.monotonic() + 120
    while gated and not client().exists(":".join([prefix, tag, "gate"])):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.05)
    client().incr(name + ":finishes")


def prepare(state: State) -> dict[str, Any]:
    visit(state["tag"], state["gated"] == "prepare", "prepare")
    return {}


def fan_out(state: State) -> list[Send]:
    return [Send("work", {**state, "i": i}) for i in range(WIDTH)]


def work(task: dict[str, Any]) -> dict[str, Any]:
    visit(task["tag"], task["gated"] == "work", "work", task["i"])
    return {"done": [task["i"] * 10]}


def total(state: State) -> dict[str, Any]:
    visit(state["tag"], state["gated"] == "total", "total")
    return {"total": sum(state["done"])}


builder = StateGraph(State)
builder.add_node("prepare", prepare)
builder.add_node("work", work)
builder.add_node("total", total)
builder.add_edge(START, "prepare")
builder.add_conditional_edges("prepare", fan_out, ["work"])
builder.add_edge("work", "total")
builder.add_edge("total", END)
graph = builder.compile()
'''

NODES = [("prepare",), *(("work", i) for i in range(WIDTH)), ("total",)]


class Stack:
    """Workers and a coordinator on given services, and the counters the nodes keep."""

    def __init__(self, directory: Path, module: str, settings: Settings, counts: str) -> None:
        self.directory = directory
        self.graph_id = f"{module}:graph"
        self.settings = settings
        self.counts = redis.Redis.from_url(counts)
        self.prefix = f"bulksync-test:{settings.queue}"
        path = [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(path),
            "BULKSYNC_QUEUE": settings.queue,
            "BULKSYNC_BROKER_URL": settings.broker_url,
            "BULKSYNC_REDIS_URL": settings.redis_url,
            "BULKSYNC_DATABASE_URL": settings.database_url,
            "BULKSYNC_TEST_COUNTS": self.prefix,
            "BULKSYNC_TEST_COUNTS_URL": counts,
        }
        self.procs: list[Proc] = []

    def start(self, workers: int) -> None:
        for n in range(workers):
            name = f"w{n}"
            argv = ["worker", "--graph", self.graph_id, "--pool", "threads", "--concurrency"]
            argv += [str(WIDTH + 1), "--hostname", f"{name}-{self.settings.queue}@localhost"]
            self.procs.append(spawn(name, argv, self.env, self.directory / f"{name}.log"))
        argv = ["coordinator", "--graph", self.graph_id]
        self.procs.append(spawn("coordinator", argv, self.env, self.directory / "coord.log"))

    def count(self, tag: str, *parts: object) -> int:
        return int(self.counts.get(":".join([self.prefix, tag, *map(str, parts)])) or 0)

    def wait_started(self, tag: str, gated: str) -> None:
        """Until every task of the gated node has started."""
        nodes = [n for n in NODES if n[0] == gated]
        deadline = time.monotonic() + WAIT
        while not all(self.count(tag, *n, "starts") for n in nodes):
            for proc in self.procs:
                proc.require_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"{gated} never started\n{self.report()}", pytrace=False)
            time.sleep(0.05)

    def open_gate(self, tag: str) -> None:
        self.counts.set(f"{self.prefix}:{tag}:gate", b"1", ex=3600)

    def finishes(self, tag: str) -> dict[tuple[object, ...], int]:
        return {n: self.count(tag, *n, "finishes") for n in NODES}

    def report(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.output()[-4000:]}" for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        for key in self.counts.scan_iter(f"{self.prefix}:*", count=10_000):
            self.counts.delete(key)
        self.counts.close()


@pytest.fixture
def graph_module(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    name = f"outagegraph_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(GRAPH_MODULE))
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        yield server
    finally:
        server.close()


def private_queue() -> str:
    return f"bulksync-test-outage-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("gated", ["work", "total"], ids=["fan-out", "chain"])
def test_a_postgres_outage_mid_run_changes_nothing(
    tmp_path: Path,
    settings: Settings,
    redis_url: str,
    private_postgres: PrivatePostgres,
    graph_module: tuple[str, Any],
    gated: str,
) -> None:
    name, module = graph_module
    tag = uuid.uuid4().hex[:8]
    value = {"tag": tag, "gated": gated}
    expected = module.graph.invoke(value)
    private = Settings(
        broker_url=settings.broker_url,
        redis_url=redis_url,
        database_url=private_postgres.url,
        queue=private_queue(),
    )
    stack = Stack(tmp_path, name, private, redis_url)
    try:
        with Client(private) as client:
            run_id = client.submit(stack.graph_id, value, require_coordinator=False)
            stack.start(workers=1)
            stack.wait_started(tag, gated)
            private_postgres.stop()
            stack.open_gate(tag)  # the gated tasks finish while Postgres is down
            time.sleep(OUTAGE)
            private_postgres.start()
            run = client.wait(run_id, timeout=WAIT)
            assert run.status == runs.SUCCESS, f"{run.status}: {run.error}\n{stack.report()}"
            assert run.output == expected
        assert stack.finishes(tag) == dict.fromkeys(NODES, 1), "each task finished once"
        for proc in stack.procs:
            proc.require_alive()
    finally:
        stack.close()


def test_a_redis_restart_mid_run_changes_nothing_and_client_wait_waits_through_it(
    tmp_path: Path,
    settings: Settings,
    redis_url: str,
    pg_schema: str,
    private_redis: PrivateRedis,
    graph_module: tuple[str, Any],
) -> None:
    name, module = graph_module
    tag = uuid.uuid4().hex[:8]
    value = {"tag": tag, "gated": "work"}
    expected = module.graph.invoke(value)
    private = Settings(
        broker_url=private_redis.url,
        redis_url=private_redis.url,
        database_url=pg_schema,
        queue=private_queue(),
    )
    stack = Stack(tmp_path, name, private, redis_url)
    try:
        with Client(private) as client:
            run_id = client.submit(stack.graph_id, value, require_coordinator=False)
            stack.start(workers=2)
            stack.wait_started(tag, "work")
            waited: queue.Queue[Any] = queue.Queue()

            def wait() -> None:  # already waiting when Redis goes away
                try:
                    waited.put(client.wait(run_id, timeout=WAIT))
                except BaseException as exc:
                    waited.put(exc)

            threading.Thread(target=wait, daemon=True).start()
            time.sleep(0.5)
            private_redis.stop()
            stack.open_gate(tag)  # the gated tasks finish while Redis is down
            time.sleep(OUTAGE)
            private_redis.start()
            run = waited.get(timeout=WAIT + 10)
            assert isinstance(run, runs.Run), f"Client.wait raised {run!r}\n{stack.report()}"
            assert run.status == runs.SUCCESS, f"{run.status}: {run.error}\n{stack.report()}"
            assert run.output == expected
            assert stack.finishes(tag) == dict.fromkeys(NODES, 1), "each task finished once"
            for proc in stack.procs:
                proc.require_alive()
            # The workers still take work after the restart: a second run finishes too.
            again = {"tag": uuid.uuid4().hex[:8], "gated": "none"}
            # The restarted Redis lost the coordinator's announcement; its heartbeat renews it.
            deadline = time.monotonic() + WAIT
            while not events.serving(client.redis, stack.graph_id):
                assert time.monotonic() < deadline, f"not announced again\n{stack.report()}"
                time.sleep(0.1)
            second = client.wait(client.submit(stack.graph_id, again), timeout=WAIT)
            assert second.status == runs.SUCCESS, f"{second.error}\n{stack.report()}"
            assert second.output == module.graph.invoke(again)
    finally:
        stack.close()
