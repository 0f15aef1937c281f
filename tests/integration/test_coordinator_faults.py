"""A coordinator killed with SIGKILL mid-run: another one takes the run over and finishes it.

Real processes only: one ``bulksync worker`` (thread pool) for the module, and per test two
``bulksync coordinator --heartbeat 1`` subprocesses (a run goes stale 3 s after its last
heartbeat) on the test's own Postgres schema and a private queue; the test submits and waits
with ``Client``. The graph, a module written to a temporary directory, runs ``prepare``, then
fans out one ``work`` task per item, then ``total``. In the worker (where
``BULKSYNC_TEST_FAULTS`` is set) every node counts its runs in Redis, each ``work`` task
counts its starts and finishes, and items from ``FREE`` on wait for the test's gate before
they finish. So when coordinator A is killed the run is mid-step, without relying on timing:

- the free tasks have finished, and A has persisted their writes as pending writes;
- the gated tasks are running on the worker, their results not recorded yet.

Coordinator B then takes the run over, in one of two orders of events:

- ``orphans-finish-first``: the gate opens right after the kill, so the orphaned tasks finish
  while no coordinator lives; B must collect their results from Redis and run nothing again;
- ``orphans-still-running``: the gate stays shut until B has dispatched the gated tasks again
  and the worker has taken those second deliveries: each finds the task's claim held by the
  live first delivery, acknowledges its message and leaves, so no task runs twice; B gets the
  results when the gate opens and the first deliveries finish.

Either way the run succeeds with the output and checkpoint history of an undisturbed
in-process run, the thread's history has no fork, and no task that had finished (its
counters snapshotted at the kill, and again when B starts) starts again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.client import Client
from bulksync.service import events, runs
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

WAIT = 90.0
"""Longest the test waits for any one thing to happen (a liveness bound, not a measure)."""

POLL = 0.1
"""Seconds between two looks at Redis or Postgres while waiting."""

HEARTBEAT = "1"
"""The coordinators' ``--heartbeat``: a run goes stale after 3 periods without one."""

CONCURRENCY = 4
"""Worker threads: the gated tasks leave the others free to take a second delivery of them."""

GRAPH_MODULE = '''
"""A fan-out for the coordinator fault tests; instrumented when BULKSYNC_TEST_FAULTS is set.

Instrumented (in the test's worker), each node counts its runs in Redis under
``<BULKSYNC_TEST_FAULTS>:<tag>:…`` (the tag comes with the input), each ``work`` task counts
its starts and finishes, and items from ``FREE`` on wait until the key ``…:gate`` exists.
Otherwise (in-process in the test) the graph is plain.
"""

import operator
import os
import time
from typing import Annotated, Any, TypedDict

import redis

from bulksync.graph import END, START, StateGraph
from bulksync.types import Send

ITEMS = 6
FREE = 4
GATE_WAIT = 300.0  # a task left waiting by a failed test gives up after this
KEY_TTL = 3600
_clients: dict[int, redis.Redis] = {}


class State(TypedDict, total=False):
    tag: str
    items: list[int]
    done: Annotated[list[int], operator.add]
    total: int


def key(tag: str, *parts: object) -> str | None:
    prefix = os.environ.get("BULKSYNC_TEST_FAULTS")
    return ":".join([prefix, tag, *map(str, parts)]) if prefix else None


def client() -> redis.Redis:
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = redis.Redis.from_url(os.environ["BULKSYNC_REDIS_URL"])
    return _clients[pid]


def count(tag: str, *parts: object) -> None:
    name = key(tag, *parts)
    if name is not None:
        pipe = client().pipeline(transaction=False)
        pipe.incr(name)
        pipe.expire(name, KEY_TTL)
        pipe.execute()


def prepare(state: State) -> dict[str, Any]:
    count(state["tag"], "prepare")
    return {}


def fan_out(state: State) -> list[Send]:
    return [Send("work", {"tag": state["tag"], "item": i}) for i in state["items"]]


def work(task: dict[str, Any]) -> dict[str, Any]:
    tag, item = task["tag"], task["item"]
    count(tag, "starts", item)
    gate = key(tag, "gate")
    if gate is not None and item >= FREE:
        deadline = time.monotonic() + GATE_WAIT
        while not client().exists(gate):
            if time.monotonic() > deadline:
                raise RuntimeError(f"work {item}: the test never opened {gate}")
            time.sleep(0.05)
    count(tag, "finishes", item)
    return {"done": [item * 10]}


def total(state: State) -> dict[str, Any]:
    count(state["tag"], "total")
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


@dataclasses.dataclass
class Proc:
    """A ``bulksync`` subprocess in its own process group, its output in a file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def require_alive(self) -> None:
        if self.popen.poll() is not None:
            pytest.fail(
                f"{self.name} exited with {self.popen.returncode}:\n{self.output()}", pytrace=False
            )


def bulksync_command() -> list[str]:
    """The ``bulksync`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("bulksync")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from bulksync.cli import main; sys.exit(main())"]


def spawn(name: str, argv: list[str], env: dict[str, str], log: Path) -> Proc:
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [*bulksync_command(), *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # pgid == pid: one signal reaches the whole process tree
        )
    return Proc(name, popen, log)


def signal_group(proc: Proc, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, sig)


def stop(proc: Proc, timeout: float = 30.0) -> None:
    """Terminate (warm shutdown), then kill the group if it does not exit in time."""
    if proc.popen.poll() is None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.popen.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc, signal.SIGKILL)  # children left behind by a leader that exited too
    proc.popen.wait()


@dataclasses.dataclass
class Fleet:
    """The module's worker and what every test needs to start coordinators beside it."""

    module: Any
    graph_id: str
    settings: Settings  # the private queue
    env: dict[str, str]
    directory: Path
    worker: Proc
    prefix: str


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, redis_url: str
) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("coordinator-faults")
    name = f"faultgraph_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(textwrap.dedent(GRAPH_MODULE))
    queue = f"bulksync-test-cfaults-{uuid.uuid4().hex[:8]}"
    path = [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "BULKSYNC_QUEUE": queue,
        "BULKSYNC_BROKER_URL": settings.broker_url,
        "BULKSYNC_REDIS_URL": settings.redis_url,
    }
    env.pop("BULKSYNC_TEST_FAULTS", None)
    prefix = f"bulksync-test:{queue}"
    hostname = f"{queue}@localhost"
    private = dataclasses.replace(settings, queue=queue)
    app = make_app(private)
    worker = spawn(
        "bulksync worker",
        [
            *("worker", "--graph", f"{name}:graph", "--pool", "threads"),
            *("--concurrency", str(CONCURRENCY), "--hostname", hostname, "--loglevel", "INFO"),
        ],
        {**env, "BULKSYNC_TEST_FAULTS": prefix},
        directory / "worker.log",
    )
    sys.path.insert(0, str(directory))
    try:
        module = importlib.import_module(name)  # plain here: BULKSYNC_TEST_FAULTS is unset
        deadline = time.monotonic() + WAIT
        while not app.control.ping(destination=[hostname], timeout=0.5):
            worker.require_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"bulksync worker did not answer a ping:\n{worker.output()}")
        yield Fleet(module, f"{name}:graph", private, env, directory, worker, prefix)
    finally:
        stop(worker, timeout=WAIT)
        app.close()
        sys.path.remove(str(directory))
        sys.modules.pop(name, None)


class Scene:
    """One test's run: its schema, coordinators, counters, and what to show when it fails."""

    def __init__(self, fleet: Fleet, database_url: str, stack: ExitStack) -> None:
        self.fleet = fleet
        self.tag = uuid.uuid4().hex[:10]
        self.thread = f"faults-{self.tag}"
        self.env = {**fleet.env, "BULKSYNC_DATABASE_URL": database_url}
        settings = dataclasses.replace(fleet.settings, database_url=database_url)
        self.client = stack.enter_context(Client(settings))
        self.saver = stack.enter_context(PostgresSaver.from_conn_string(database_url, max_size=2))
        self.saver.setup()  # before any coordinator, so none races it over the migrations
        self.redis = stack.enter_context(redis.Redis.from_url(settings.redis_url))
        self.coordinators: list[Proc] = []
        self.run_id: str | None = None

    def key(self, *parts: object) -> str:
        return ":".join([self.fleet.prefix, self.tag, *map(str, parts)])

    def count(self, *parts: object) -> int:
        return int(self.redis.get(self.key(*parts)) or 0)

    def counters(self, what: str) -> dict[int, int]:
        return {i: self.count(what, i) for i in range(self.fleet.module.ITEMS)}

    def start_coordinator(self, name: str) -> Proc:
        argv = ["coordinator", "--graph", self.fleet.graph_id, "--heartbeat", HEARTBEAT]
        log = self.fleet.directory / f"{self.tag}-{name.replace(' ', '-')}.log"
        proc = spawn(name, argv, self.env, log)
        self.coordinators.append(proc)
        return proc

    def open_gate(self) -> None:
        self.redis.set(self.key("gate"), b"1", ex=self.fleet.module.KEY_TTL)

    def finished_tasks(self) -> set[str]:
        """Tasks of the head checkpoint whose writes are persisted as pending writes."""
        config = {"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}}
        head = self.saver.get_tuple(config)
        if head is None:
            return set()
        return {task_id for task_id, channel, _ in head.pending_writes if channel == "done"}

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Poll ``condition`` for up to ``WAIT`` s; fail naming ``what`` and the evidence."""
        deadline = time.monotonic() + WAIT
        while not condition():
            self.fleet.worker.require_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {WAIT:g}s\n{self.report()}", pytrace=False)
            time.sleep(POLL)

    def report(self) -> str:
        """The run's row, the counters and every process's output, for a failure message."""
        lines = [f"thread {self.thread}, tag {self.tag}"]
        if self.run_id is not None:
            run = self.client.get(self.run_id)
            lines.append(
                f"run {run.run_id}: status={run.status} owner={run.owner} "
                f"attempts={run.attempts} heartbeat_at={run.heartbeat_at} error={run.error}"
            )
        lines.append(f"starts {self.counters('starts')}, finishes {self.counters('finishes')}")
        lines.append(f"prepare ran {self.count('prepare')}, total ran {self.count('total')}")
        lines.append(f"pending writes of 'done' on the head: {len(self.finished_tasks())} tasks")
        for proc in self.coordinators:
            state = "running" if proc.popen.poll() is None else f"exit {proc.popen.returncode}"
            lines.append(f"--- {proc.name} (pid {proc.pid}, {state})\n{proc.output()}")
        lines.append(f"--- worker (last 4000 chars)\n{self.fleet.worker.output()[-4000:]}")
        return "\n".join(lines)

    def close(self) -> None:
        self.open_gate()  # frees any worker thread still waiting on it
        for proc in self.coordinators:
            stop(proc)
        for name in self.redis.scan_iter(f"{self.key()}:*", count=10_000):
            self.redis.expire(name, 60)  # a task finishing late writes nothing that lasts


@pytest.fixture
def scene(fleet: Fleet, pg_schema: str) -> Iterator[Scene]:
    with ExitStack() as stack:
        created = Scene(fleet, pg_schema, stack)
        stack.callback(created.close)
        yield created


def owned_by(run: runs.Run, proc: Proc) -> bool:
    """Whether ``proc`` is the run's owner (owners are ``host:pid:random``)."""
    return run.owner is not None and run.owner.split(":")[1] == str(proc.pid)


def history(graph: Any, thread: str) -> list[tuple[Any, ...]]:
    """What a thread's checkpoints show, newest first, without ids or times."""
    snapshots = graph.get_state_history({"configurable": {"thread_id": thread}})
    return [(s.metadata["step"], s.metadata["source"], s.next, s.values) for s in snapshots]


def assert_linear(saver: PostgresSaver, thread: str) -> None:
    """The thread's checkpoints form one chain: one root, no two with the same parent."""
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saved = list(saver.list(config))
    parent = {
        t.checkpoint.id: (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        for t in saved
    }
    forks = {p: n for p, n in collections.Counter(parent.values()).items() if n > 1}
    assert not forks, f"checkpoints sharing a parent (a forked chain): {forks}"
    assert saved, f"thread {thread} has no checkpoint"
    chain: list[str] = []
    at: str | None = saved[0].checkpoint.id  # newest first
    while at is not None:
        chain.append(at)
        at = parent.get(at)
    assert chain == [t.checkpoint.id for t in saved], "the history is not one chain"


@pytest.mark.parametrize("orphans", ["finish-first", "still-running"])
def test_killed_coordinator_run_is_taken_over_with_the_undisturbed_result(
    fleet: Fleet, scene: Scene, orphans: str
) -> None:
    module = fleet.module
    items = list(range(module.ITEMS))
    gated = [i for i in items if i >= module.FREE]
    value = {"tag": scene.tag, "items": items}

    a = scene.start_coordinator("coordinator A")
    scene.wait_until(lambda: events.serving(scene.redis, fleet.graph_id) > 0, "A announced")
    run_id = scene.run_id = scene.client.submit(fleet.graph_id, value, thread_id=scene.thread)

    # Mid-step: the free tasks finished and A persisted them; the gated ones run on the worker.
    def mid_step() -> bool:
        a.require_alive()
        starts, finishes = scene.counters("starts"), scene.counters("finishes")
        return (
            all(finishes[i] == 1 for i in items if i not in gated)
            and all(starts[i] == 1 and finishes[i] == 0 for i in gated)
            and len(scene.finished_tasks()) == len(items) - len(gated)
        )

    scene.wait_until(mid_step, "coordinator A mid-step with its finished tasks persisted")
    run = scene.client.get(run_id)
    assert run.status == runs.RUNNING and owned_by(run, a), scene.report()

    signal_group(a, signal.SIGKILL)
    a.popen.wait()
    at_kill = (scene.counters("starts"), scene.counters("finishes"))
    run = scene.client.get(run_id)
    assert run.status == runs.RUNNING and owned_by(run, a), "still claimed by the dead one"

    if orphans == "finish-first":
        scene.open_gate()
        scene.wait_until(
            lambda: all(scene.count("finishes", i) == 1 for i in gated),
            "the tasks orphaned by A finishing on the worker",
        )
    at_takeover = (scene.counters("starts"), scene.counters("finishes"))
    received = scene.fleet.worker.output().count(".work[")
    b = scene.start_coordinator("coordinator B")
    if orphans == "still-running":
        # B found no result for the gated tasks and dispatched them again; the worker takes
        # each second delivery (logging it as received, then as done) while the first waits.
        def duplicates_handled() -> bool:
            b.require_alive()
            return scene.fleet.worker.output().count(".work[") >= received + 2 * len(gated)

        scene.wait_until(duplicates_handled, "the worker taking B's second deliveries")
        scene.open_gate()

    try:
        run = scene.client.wait(run_id, timeout=WAIT)
    except TimeoutError:
        pytest.fail(f"the run did not end after the takeover\n{scene.report()}", pytrace=False)
    assert run.status == runs.SUCCESS, scene.report()
    assert owned_by(run, b) and run.attempts == 2, scene.report()

    # The same final state and the same history as an undisturbed in-process run.
    assert run.output == module.graph.invoke(value)
    reference = module.graph.with_checkpointer(InMemorySaver())
    reference.invoke(value, {"configurable": {"thread_id": "reference"}})
    cluster = module.graph.with_checkpointer(scene.saver)
    assert history(cluster, scene.thread) == history(reference, "reference")
    assert_linear(scene.saver, scene.thread)

    # No task that had finished started again; the steps around the fan-out ran once.
    starts, finishes = scene.counters("starts"), scene.counters("finishes")
    for snapshot_starts, snapshot_finishes in (at_kill, at_takeover):
        done = [i for i in items if snapshot_finishes[i] > 0]
        assert {i: starts[i] for i in done} == {i: snapshot_starts[i] for i in done}, (
            f"finished tasks started again: {starts} (at the snapshot {snapshot_starts})"
        )
    assert all(finishes[i] >= 1 for i in items), finishes
    assert (scene.count("prepare"), scene.count("total")) == (1, 1)
    # Every result was recorded before B, or the claim of the live first delivery kept the
    # second one from starting: either way no task ran twice.
    assert starts == finishes == dict.fromkeys(items, 1)
