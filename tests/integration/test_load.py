"""Many runs at once on one coordinator: none fails for the runtime's own resource limits.

Real processes: two ``bulksync worker`` subprocesses (thread pools) on a private queue and
one ``bulksync coordinator --max-runs 300`` on the test's own Postgres schema. ``RUNS`` runs
are queued first, so the coordinator claims them all in one go and drives every one at
once: each waiting step used to hold a Redis connection of its own (past redis-py's pool
cap of 100: ``MaxConnectionsError``), and now the executor's one gatherer waits on all. Nor
does a waiting run hold a thread: the coordinator process's threads, sampled meanwhile,
stay far below the runs it drives (it had two per run before the reactor).

Each run is a chain into a small fan-out (``prepare`` → ``WIDTH`` ``work`` tasks → ``total``);
nodes count their completions in Redis. Every run must succeed with the output of an
undisturbed in-process run, and every task must have completed exactly once.
"""

from __future__ import annotations

import importlib
import os
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
from bulksync.service import runs
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from tests.integration.test_coordinator_faults import Proc, spawn, stop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RUNS = 300
"""Runs queued at once (``--max-runs`` lets the coordinator drive them all together)."""

WIDTH = 3
"""``work`` tasks per run."""

WAIT = 150.0
"""Longest the test waits for all runs to finish (a liveness bound, not a measure)."""

MAX_THREADS = 60
"""Most threads the coordinator process may have while it drives ``RUNS`` runs: its
``drive_threads`` (8), the gatherer, heartbeat and timer threads, Celery's and redis-py's."""

GRAPH_MODULE = '''
"""A chain into a small fan-out; nodes count completions when BULKSYNC_TEST_LOAD is set."""

import operator
import os
import threading
from typing import Annotated, Any, TypedDict

import redis

from bulksync.graph import END, START, StateGraph
from bulksync.types import Send

_clients: dict[int, redis.Redis] = {}
_lock = threading.Lock()


class State(TypedDict, total=False):
    n: int
    done: Annotated[list[int], operator.add]
    total: int


def count(*parts: object) -> None:
    prefix = os.environ.get("BULKSYNC_TEST_LOAD")
    if prefix:
        pid = os.getpid()
        with _lock:  # a client two threads made at once would be closed under one of them
            client = _clients.get(pid)
            if client is None:
                client = _clients[pid] = redis.Redis.from_url(os.environ["BULKSYNC_REDIS_URL"])
        pipe = client.pipeline(transaction=False)
        name = ":".join([prefix, *map(str, parts)])
        pipe.incr(name)
        pipe.expire(name, 3600)
        pipe.execute()


def prepare(state: State) -> dict[str, Any]:
    count("prepare", state["n"])
    return {}


def fan_out(state: State) -> list[Send]:
    return [Send("work", {"n": state["n"], "i": i}) for i in range(WIDTH)]


def work(task: dict[str, Any]) -> dict[str, Any]:
    count("work", task["n"], task["i"])
    return {"done": [task["n"] * 10 + task["i"]]}


def total(state: State) -> dict[str, Any]:
    count("total", state["n"])
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


class _ThreadCount:
    """The most threads process ``pid`` had, sampled every 20 ms while open."""

    def __init__(self, pid: int) -> None:
        self.status = Path(f"/proc/{pid}/status")
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> _ThreadCount:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                lines = self.status.read_text().splitlines()
            except OSError:  # the process is gone: the test says why
                return
            for line in lines:
                if line.startswith("Threads:"):
                    self.most = max(self.most, int(line.split()[1]))


@pytest.fixture
def load_module(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    name = f"loadgraph_{uuid.uuid4().hex[:10]}"
    source = textwrap.dedent(GRAPH_MODULE).replace("range(WIDTH)", f"range({WIDTH})")
    (tmp_path / f"{name}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_hundreds_of_runs_at_once_all_finish_with_the_undisturbed_output(
    tmp_path: Path,
    settings: Settings,
    redis_url: str,
    pg_schema: str,
    load_module: tuple[str, Any],
) -> None:
    name, module = load_module
    queue = f"bulksync-test-load-{uuid.uuid4().hex[:8]}"
    prefix = f"bulksync-test:{queue}"
    path = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "BULKSYNC_QUEUE": queue,
        "BULKSYNC_BROKER_URL": settings.broker_url,
        "BULKSYNC_REDIS_URL": redis_url,
        "BULKSYNC_DATABASE_URL": pg_schema,
        "BULKSYNC_TEST_LOAD": prefix,
    }
    private = Settings(
        broker_url=settings.broker_url, redis_url=redis_url, database_url=pg_schema, queue=queue
    )
    app = make_app(private)
    r = redis.Redis.from_url(redis_url)
    procs: list[Proc] = []
    expected = {n: module.graph.invoke({"n": n})["total"] for n in range(RUNS)}
    try:
        with Client(private) as client:
            # Queued before any coordinator starts, all at once.
            ids = {
                client.submit(f"{name}:graph", {"n": n}, require_coordinator=False): n
                for n in range(RUNS)
            }
            for w in ("w1", "w2"):
                argv = ["worker", "--graph", f"{name}:graph", "--pool", "threads"]
                argv += ["--concurrency", "4", "--hostname", f"{w}-{queue}@localhost"]
                procs.append(spawn(w, argv, env, tmp_path / f"{w}.log"))
            argv = ["coordinator", "--graph", f"{name}:graph", "--max-runs", str(RUNS)]
            procs.append(spawn("coordinator", argv, env, tmp_path / "coordinator.log"))
            deadline = time.monotonic() + WAIT
            final: dict[str, runs.Run] = {}
            with _ThreadCount(procs[-1].pid) as threads:
                for run_id in ids:
                    left = max(1.0, deadline - time.monotonic())
                    try:
                        final[run_id] = client.wait(run_id, timeout=left)
                    except TimeoutError:
                        break
            statuses = [final[i].status if i in final else "unfinished" for i in ids]
            failed = {s: statuses.count(s) for s in set(statuses) if s != runs.SUCCESS}
            errors = {r.run_id: r.error for r in final.values() if r.status != runs.SUCCESS}
            logs = "\n".join(f"--- {p.name}\n{p.output()[-3000:]}" for p in procs)
            assert not failed, f"runs not successful: {failed}; errors: {errors}\n{logs}"
            outputs = {ids[i]: run.output["total"] for i, run in final.items()}
            assert outputs == expected
            assert 0 < threads.most <= MAX_THREADS, f"coordinator threads: {threads.most}"
        counts = {
            what: [int(r.get(f"{prefix}:{what}:{n}") or 0) for n in range(RUNS)]
            for what in ("prepare", "total")
        }
        assert counts == {"prepare": [1] * RUNS, "total": [1] * RUNS}
        works = [
            int(r.get(f"{prefix}:work:{n}:{i}") or 0) for n in range(RUNS) for i in range(WIDTH)
        ]
        assert works == [1] * (RUNS * WIDTH), "every work task completed exactly once"
        for p in procs:
            p.require_alive()
    finally:
        for p in procs:
            stop(p)
        app.close()
        for key in r.scan_iter(f"{prefix}:*", count=10_000):
            r.delete(key)
        r.close()
