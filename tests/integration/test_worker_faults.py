"""Workers killed mid-task: the run completes with the undisturbed final state, and no task
that had finished runs twice.

Two ``bulksync worker`` subprocesses (prefork, one pool process each) share a private queue.
A Send fan-out's tasks record each start and finish in Redis; one task (the victim) blocks on
its first attempt so that the test can kill the process running it:

- the whole worker (``kill -9`` of its process group): its unacknowledged message stays in
  the Redis broker's unacked set until the visibility timeout passes and the surviving
  worker's consumer restores it (``BULKSYNC_VISIBILITY_TIMEOUT`` is set low here);
- only the pool process running the task: the worker's main process sees the loss and, with
  reject-on-worker-lost, puts the message back at once.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import queue
import signal
import subprocess
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
from kombu.transport.redis import Channel as RedisChannel

from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

READY_WAIT = 60.0
"""Longest a worker may take to answer a ping (a liveness bound, not a measure)."""

RECOVERY_WAIT = 150.0
"""Longest the run may take to finish after the kill (a liveness bound: a run that never
completes fails here instead of hanging). Generous, because how soon the dead worker's message
comes back depends on kombu's restore sweep, checked on its own by the last test below."""

VISIBILITY_TIMEOUT = 5
TASKS = 8
VICTIM = 3

GRAPH_MODULE = f'''
"""A fan-out whose tasks record their starts and finishes in Redis (when FAULT_PREFIX is set)."""

import json
import operator
import os
import time
from typing import Annotated, Any, TypedDict

import redis

from bulksync.graph import START, StateGraph
from bulksync.types import Send

VICTIM = {VICTIM}


class State(TypedDict, total=False):
    log: Annotated[list[Any], operator.add]
    summary: str


def route(state: State) -> list[Send]:
    return [Send("work", i) for i in range({TASKS})]


def work(i: int) -> dict[str, Any]:
    prefix = os.environ.get("FAULT_PREFIX")
    if prefix:
        r = redis.Redis.from_url(os.environ["BULKSYNC_REDIS_URL"])
        attempt = r.incr(f"{{prefix}}:starts:{{i}}")
        r.rpush(f"{{prefix}}:started", json.dumps([i, attempt, os.getpgid(0), os.getpid()]))
        if i == VICTIM and attempt == 1:
            time.sleep(600)  # the test kills this process here
        r.incr(f"{{prefix}}:finishes:{{i}}")
    return {{"log": [i * i]}}


def summarize(state: State) -> dict[str, Any]:
    return {{"summary": f"{{len(state['log'])}} done, total {{sum(state['log'])}}"}}


builder = StateGraph(State)
builder.add_node("work", work)
builder.add_node("summarize", summarize)
builder.add_conditional_edges(START, route, ["work"])
builder.add_edge("work", "summarize")
graph = builder.compile()
'''


@dataclasses.dataclass
class Fleet:
    """Two worker processes on one private queue, and what the test needs to judge a run."""

    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    module: Any
    settings: Settings
    prefix: str
    redis: redis.Redis

    def output(self) -> str:
        return "\n".join(
            f"--- worker {i}\n{p.read_text(errors='replace')}" for i, p in enumerate(self.logs)
        )

    def count(self, what: str, i: int) -> int:
        return int(self.redis.get(f"{self.prefix}:{what}:{i}") or 0)

    def next_start(self, timeout: float) -> tuple[int, int, int, int]:
        item = self.redis.blpop([f"{self.prefix}:started"], timeout=timeout)
        assert item is not None, f"no task started:\n{self.output()}"
        i, attempt, pgid, pid = json.loads(item[1])
        return i, attempt, pgid, pid


def bulksync_command() -> list[str]:
    script = Path(sys.executable).with_name("bulksync")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from bulksync.cli import main; sys.exit(main())"]


def wait_ready(app: Any, proc: subprocess.Popen[bytes], hostname: str, log: Path) -> None:
    deadline = time.monotonic() + READY_WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"worker exited with {proc.returncode}:\n{log.read_text()}")
        if app.control.ping(destination=[hostname], timeout=0.5):
            return
    pytest.fail(f"worker did not answer a ping:\n{log.read_text()}")


@pytest.fixture
def fleet(tmp_path: Path, settings: Settings, redis_client: redis.Redis) -> Iterator[Fleet]:
    name = f"bulksync_it_faults_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(GRAPH_MODULE))
    sys.path.insert(0, str(tmp_path))
    module = importlib.import_module(name)
    queue_name = f"bulksync-test-faults-{uuid.uuid4().hex[:8]}"
    prefix = f"bulksync-test:{queue_name}"
    worker_settings = dataclasses.replace(
        settings, queue=queue_name, visibility_timeout=float(VISIBILITY_TIMEOUT)
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "BULKSYNC_QUEUE": queue_name,
        "BULKSYNC_BROKER_URL": settings.broker_url,
        "BULKSYNC_REDIS_URL": settings.redis_url,
        "BULKSYNC_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT),
        "FAULT_PREFIX": prefix,
    }
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    app = make_app(worker_settings)
    try:
        for n in range(2):
            hostname = f"{queue_name}-{n}@localhost"
            log = tmp_path / f"worker-{n}.log"
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [
                            *bulksync_command(),
                            "worker",
                            "--graph",
                            f"{name}:graph",
                            "--pool",
                            "prefork",
                            "--concurrency",
                            "1",
                            "--hostname",
                            hostname,
                        ],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # pgid == pid: kill -9 takes the whole worker
                    )
                )
            logs.append(log)
            wait_ready(app, procs[-1], hostname, log)
        yield Fleet(procs, logs, module, worker_settings, prefix, redis_client)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        for key in redis_client.scan_iter(f"{prefix}:*", count=10_000):
            redis_client.delete(key)


def start_run(fleet: Fleet) -> queue.Queue[Any]:
    """Invoke the graph on the fleet from a thread; its output (or error) lands in the queue."""
    graph = fleet.module.graph
    outcome: queue.Queue[Any] = queue.Queue()

    def body() -> None:
        try:
            with CeleryExecutor(fleet.settings, f"{fleet.module.__name__}:graph", graph) as ex:
                outcome.put(graph.with_executor(ex).invoke({"log": []}))
        except BaseException as exc:
            outcome.put(exc)

    threading.Thread(target=body, daemon=True).start()
    return outcome


def wait_for_victim(fleet: Fleet) -> tuple[int, int]:
    """Block until the victim's first attempt started; return its ``(pgid, pid)``."""
    while True:
        i, attempt, pgid, pid = fleet.next_start(timeout=RECOVERY_WAIT)
        if i == VICTIM and attempt == 1:
            return pgid, pid


def check_outcome(fleet: Fleet, outcome: queue.Queue[Any]) -> None:
    """Same final state as in-process; finished tasks ran once; the victim ran again."""
    try:
        out = outcome.get(timeout=RECOVERY_WAIT)
    except queue.Empty:
        pytest.fail(
            f"the run did not complete after the kill; unacked messages: "
            f"{fleet.redis.hlen('unacked')}\n{fleet.output()}"
        )
    assert not isinstance(out, BaseException), out
    assert out == fleet.module.graph.invoke({"log": []})  # in-process, nothing recorded
    finishes = {i: fleet.count("finishes", i) for i in range(TASKS)}
    starts = {i: fleet.count("starts", i) for i in range(TASKS)}
    assert finishes == dict.fromkeys(range(TASKS), 1)
    assert starts == {i: 2 if i == VICTIM else 1 for i in range(TASKS)}


def test_worker_killed_mid_task_comes_back_after_the_visibility_timeout(fleet: Fleet) -> None:
    outcome = start_run(fleet)
    pgid, _ = wait_for_victim(fleet)
    assert pgid in [p.pid for p in fleet.procs]
    os.killpg(pgid, signal.SIGKILL)
    check_outcome(fleet, outcome)
    survivor = next(p.pid for p in fleet.procs if p.pid != pgid)
    # The starts not yet read (wait_for_victim consumed those up to the victim's first).
    later = [json.loads(e) for e in fleet.redis.lrange(f"{fleet.prefix}:started", 0, -1)]
    assert [s[2] for s in later if s[0] == VICTIM] == [survivor]


def test_pool_process_killed_mid_task_is_put_back_by_its_worker(fleet: Fleet) -> None:
    outcome = start_run(fleet)
    pgid, pid = wait_for_victim(fleet)
    assert pgid in [p.pid for p in fleet.procs] and pid != pgid
    os.kill(pid, signal.SIGKILL)  # the main process lives on and sees its child lost
    check_outcome(fleet, outcome)


@pytest.mark.parametrize("visibility_timeout", [5.0, 60.0, 3600.0])
def test_redis_broker_looks_for_lost_messages_within_the_visibility_timeout(
    settings: Settings, visibility_timeout: float
) -> None:
    # kombu's Redis transport sweeps its unacked set every `unacked_restore_interval` seconds
    # but scans only on every `unacked_restore_throttle`-th sweep (10 and 10 by default: once
    # per ~100 s, whatever the visibility timeout). A dead worker's message then waits for that
    # scan, not for the visibility timeout the settings promise.
    app = make_app(dataclasses.replace(settings, visibility_timeout=visibility_timeout))
    options = app.conf.broker_transport_options
    interval = options.get("unacked_restore_interval", RedisChannel.unacked_restore_interval)
    throttle = options.get("unacked_restore_throttle", RedisChannel.unacked_restore_throttle)
    assert options["visibility_timeout"] == visibility_timeout
    assert interval * throttle <= visibility_timeout, (
        f"lost messages are looked for every {interval * throttle:g}s, longer than the "
        f"{visibility_timeout:g}s visibility timeout"
    )
