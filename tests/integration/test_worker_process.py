"""``bulksync worker --graph`` as a real subprocess, driven by an attached Celery executor.

The graph lives in a module written to a temporary directory, which is on ``PYTHONPATH`` for
the worker and on ``sys.path`` here, so both processes import it under the same name and the
graph id ``<module>:graph`` means the same graph on both sides.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulksync.errors import UnknownGraphError
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor

pytestmark = pytest.mark.integration

READY_WAIT = 60.0
"""Longest the test waits for the worker to answer a ping (a liveness bound, not a measure)."""

GRAPH_MODULE = '''
"""Graphs served by a `bulksync worker` subprocess in tests."""

import operator
import os
from typing import Annotated, Any, TypedDict

from bulksync.cache.redis import RedisCache
from bulksync.func import entrypoint, task
from bulksync.graph import START, StateGraph
from bulksync.types import CachePolicy, Send


class State(TypedDict, total=False):
    log: Annotated[list[Any], operator.add]
    pids: Annotated[list[int], operator.add]
    summary: str


def route(state: State) -> list[Send]:
    return [Send("square", i) for i in range(20)]


def square(i: int) -> dict[str, Any]:
    return {"log": [i * i], "pids": [os.getpid()]}


def summarize(state: State) -> dict[str, Any]:
    return {"summary": f"{len(state['log'])} squares, total {sum(state['log'])}"}


builder = StateGraph(State)
builder.add_node("square", square)
builder.add_node("summarize", summarize)
builder.add_conditional_edges(START, route, ["square"])
builder.add_edge("square", "summarize")
graph = builder.compile()


@task(cache_policy=CachePolicy())
def cached_square(i: int) -> dict[str, int]:
    return {"square": i * i, "pid": os.getpid()}


# One Redis prefix per test module, the same in the worker's processes and the test's.
cache = RedisCache(prefix=f"bulksync-test:{__name__}:")


@entrypoint(cache=cache)
def squares(n: int) -> list[dict[str, int]]:
    return [call.result() for call in [cached_square(i) for i in range(n)]]
'''


@dataclasses.dataclass
class WorkerProcess:
    """A running ``bulksync worker`` and what it serves."""

    proc: subprocess.Popen[bytes]
    hostname: str
    module: Any
    settings: Settings
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def bulksync_command() -> list[str]:
    """The ``bulksync`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("bulksync")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from bulksync.cli import main; sys.exit(main())"]


def write_graph_module(directory: Path, source: str) -> str:
    """Write ``source`` as a fresh module in ``directory``; return its (unique) name."""
    name = f"bulksync_it_graph_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def worker_env(directory: Path, settings: Settings, queue: str, **extra: str) -> dict[str, str]:
    """The environment of a worker serving ``queue`` with the graph modules in
    ``directory`` importable, on ``settings``' services (and ``extra`` variables)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]),
        "BULKSYNC_QUEUE": queue,
        "BULKSYNC_BROKER_URL": settings.broker_url,
        "BULKSYNC_REDIS_URL": settings.redis_url,
        **extra,
    }


def start_worker(
    directory: Path,
    module: Any,
    settings: Settings,
    env: dict[str, str],
    hostname: str,
    graphs: tuple[str, ...] = ("graph",),
) -> WorkerProcess:
    """A prefork ``bulksync worker`` of ``module``'s ``graphs``, two processes, with ``env``
    (its own process group, so nothing leaks past the test); its log in ``directory``."""
    log = directory / f"{hostname.split('@')[0]}.log"
    loaded = [arg for graph in graphs for arg in ("--graph", f"{module.__name__}:{graph}")]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *bulksync_command(),
                "worker",
                *loaded,
                *("--pool", "prefork", "--concurrency", "2", "--hostname", hostname),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(proc, hostname, module, settings, log)


def wait_ready(app: Any, worker: WorkerProcess) -> None:
    """Block until the worker answers a ping; fail with its output if it exits or stays mute."""
    deadline = time.monotonic() + READY_WAIT
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            pytest.fail(f"bulksync worker exited with {worker.proc.returncode}:\n{worker.output()}")
        if app.control.ping(destination=[worker.hostname], timeout=0.5):
            return
    pytest.fail(f"bulksync worker did not answer a ping:\n{worker.output()}")


def stop(worker: WorkerProcess) -> int:
    """Warm shutdown (SIGTERM); return the exit code, killing the group if it hangs."""
    if worker.proc.poll() is None:
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(timeout=READY_WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait()
    return worker.proc.returncode


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, redis_url: str
) -> Iterator[WorkerProcess]:
    directory = tmp_path_factory.mktemp("graphs")
    name = write_graph_module(directory, GRAPH_MODULE)
    sys.path.insert(0, str(directory))
    module = importlib.import_module(name)
    queue = f"bulksync-test-proc-{uuid.uuid4().hex[:8]}"
    hostname = f"{queue}@localhost"
    env = worker_env(directory, settings, queue)
    settings = dataclasses.replace(settings, queue=queue)
    running = start_worker(directory, module, settings, env, hostname, ("graph", "squares"))
    try:
        wait_ready(make_app(running.settings), running)
        yield running
    finally:
        stop(running)
        sys.path.remove(str(directory))
        sys.modules.pop(name, None)


def test_subprocess_worker_runs_the_graph(worker: WorkerProcess) -> None:
    graph = worker.module.graph
    graph_id = f"{worker.module.__name__}:graph"
    with CeleryExecutor(worker.settings, graph_id, graph) as executor:
        out = graph.with_executor(executor).invoke({"log": []})
    local = graph.invoke({"log": []})
    assert out["log"] == local["log"] == [i * i for i in range(20)]
    assert out["summary"] == local["summary"]
    assert os.getpid() not in out["pids"]  # the squares ran in the worker's processes
    banner = worker.output()
    assert f"bulksync worker: graphs {graph_id}" in banner
    assert f"queues {worker.settings.queue}" in banner


def test_workers_share_task_results_through_a_redis_cache(worker: WorkerProcess) -> None:
    squares = worker.module.squares
    executor = CeleryExecutor(worker.settings, f"{worker.module.__name__}:squares", squares)
    try:
        on_workers = squares.with_executor(executor).invoke(3)
        assert [r["square"] for r in on_workers] == [0, 1, 4]
        assert os.getpid() not in {r["pid"] for r in on_workers}
        # In this process the three calls made on the workers are cache hits: their
        # results still name the worker processes; only the new one runs here.
        here = squares.invoke(4)
        assert here[:3] == on_workers
        assert here[3] == {"square": 9, "pid": os.getpid()}
    finally:
        executor.close()
        squares.clear_cache()
        worker.module.cache.client.close()  # this process's client; the workers keep theirs


def test_subprocess_worker_refuses_a_graph_it_did_not_load(worker: WorkerProcess) -> None:
    other = f"{worker.module.__name__}:other_graph"
    with (
        CeleryExecutor(worker.settings, other, worker.module.graph) as executor,
        pytest.raises(UnknownGraphError) as info,
    ):
        worker.module.graph.with_executor(executor).invoke({"log": []})
    assert f"graph '{other}' is not loaded" in str(info.value)
    assert f"--graph {other}" in str(info.value)
    assert f"{worker.module.__name__}:graph" in str(info.value)  # what it did load


def test_subprocess_worker_stops_cleanly(worker: WorkerProcess) -> None:
    # Runs last in this module: a warm shutdown ends the worker with exit code 0.
    assert stop(worker) == 0, worker.output()
