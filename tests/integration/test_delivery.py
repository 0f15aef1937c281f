"""Task delivery under faults (issue 8, items 8, 4, 6, 5, 10): claims, lost workers, poison
tasks, lost messages and cancelled batches.

Nodes count their starts and finishes in Redis, so each test checks how many times every
task ran to the end, and that the final state equals an undisturbed in-process run. Tests on
the session's in-process worker (threads) publish or cancel; tests that kill workers start
``bulksync worker`` subprocesses (prefork, one pool process each) on a private queue, with a
short claim lease so that a dead worker is noticed in a few seconds.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import operator
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
from typing import Annotated, Any, TypedDict

import pytest
import redis
from celery.signals import after_task_publish, task_postrun

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.errors import TaskCancelledError, WorkerLostError
from bulksync.graph import END, START, StateGraph
from bulksync.service.cancel import cancel_run
from bulksync.settings import Settings
from bulksync.types import Send
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor
from tests.integration.test_worker_faults import bulksync_command, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WAIT = 60.0
"""Longest a run may take to finish (a liveness bound: a stalled run fails here, not hangs)."""

LEASE = 3.0
"""The claim lease of the subprocess tests: a dead worker's task is dispatched again after it."""

TASKS = 8
VICTIM = 3


class Log(TypedDict, total=False):
    log: Annotated[list[Any], operator.add]


def counter(r: redis.Redis, prefix: str, what: str, n: int) -> dict[int, int]:
    """``{task: count}`` of the ``what`` counters a test's nodes kept under ``prefix``."""
    values = r.mget([f"{prefix}:{what}:{i}" for i in range(n)])
    return {i: int(v or 0) for i, v in enumerate(values)}


def background(fn: Any) -> queue.Queue[Any]:
    """Run ``fn`` on a thread; its return value or exception lands in the returned queue."""
    out: queue.Queue[Any] = queue.Queue()

    def body() -> None:
        try:
            out.put(fn())
        except BaseException as exc:
            out.put(exc)

    threading.Thread(target=body, daemon=True).start()
    return out


# -- item 8: a message delivered twice runs once ---------------------------------------


def test_every_message_published_twice_runs_each_task_once(
    cluster: Any, redis_client: redis.Redis
) -> None:
    r = redis_client
    prefix = f"bulksync-test:dup:{uuid.uuid4().hex}"
    n = 200

    def work(arg: dict[str, int]) -> dict[str, Any]:
        time.sleep(0.02)  # long enough for the copy to arrive while the original runs
        r.incr(f"{prefix}:finishes:{arg['i']}")
        return {"log": [arg["i"]]}

    b = StateGraph(Log)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(n)])
    b.add_edge("work", END)
    graph = b.compile()
    graph_id = cluster.register(graph)
    copies: set[str] = set()

    def duplicate(
        sender: str | None = None, body: Any = None, headers: Any = None, **kw: Any
    ) -> None:
        if not sender or not sender.startswith(f"{graph_id}.") or headers["id"] in copies:
            return
        copy = uuid.uuid4().hex
        copies.add(copy)
        cluster.app.send_task(
            sender,
            args=body[0],
            task_id=copy,
            queue=kw.get("routing_key") or cluster.settings.queue,
            headers={"bulksync": graph_id},
        )

    after_task_publish.connect(duplicate, weak=False)
    try:
        out = cluster.attach(graph, graph_id).invoke({"log": []})
    finally:
        after_task_publish.disconnect(duplicate)
    try:
        assert out == {"log": list(range(n))}
        assert copies, "no message was published twice"
        assert counter(r, prefix, "finishes", n) == dict.fromkeys(range(n), 1)
    finally:
        r.delete(*[f"{prefix}:finishes:{i}" for i in range(n)])


# -- item 10: a cancelled batch stops between its tasks --------------------------------


def test_cancel_mid_batch_runs_no_further_task_of_the_batch(
    cluster: Any, redis_client: redis.Redis
) -> None:
    r = redis_client
    key = f"bulksync-test:batch:{uuid.uuid4().hex}"
    started: queue.Queue[int] = queue.Queue()
    release = threading.Event()
    n = 64

    def work(arg: dict[str, int]) -> dict[str, Any]:
        r.incr(key)
        started.put(arg["i"])
        release.wait(WAIT)  # the test cancels while the batch's first task runs
        return {"log": [arg["i"]]}

    b = StateGraph(Log)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(n)])
    b.add_edge("work", END)
    graph = b.compile(checkpointer=InMemorySaver())
    graph_id = cluster.register(graph)
    # One message carries the whole fan-out.
    settings = dataclasses.replace(cluster.settings, target_messages=1, max_batch=n)
    executor = cluster.executor(graph_id, graph, settings)
    run_id = f"batch-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": run_id}, "run_id": run_id}
    done = threading.Event()

    def on_postrun(sender: Any = None, **kw: Any) -> None:
        if getattr(sender, "name", "") == f"{graph_id}.work":
            done.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        outcome = background(lambda: graph.with_executor(executor).invoke({"log": []}, config))
        started.get(timeout=WAIT)
        cancel_run(r, run_id, settings)
        result = outcome.get(timeout=WAIT)
        release.set()
        assert done.wait(WAIT), "the batch's message never finished"
    finally:
        release.set()
        task_postrun.disconnect(on_postrun)
    try:
        assert isinstance(result, TaskCancelledError), result
        assert int(r.get(key) or 0) == 1  # the task running at the cancel; no later one
    finally:
        r.delete(key)


# -- worker subprocesses ---------------------------------------------------------------

GRAPH_MODULE = f'''
"""A fan-out whose tasks count starts and finishes in Redis (when FAULT_PREFIX is set); the
victim task (FAULT_VICTIM, else {VICTIM}) misbehaves as FAULT_MODE says: hang (first
attempt), exit (every attempt)."""

import json
import operator
import os
import time
from typing import Annotated, Any, TypedDict

import redis

from bulksync.graph import START, StateGraph
from bulksync.types import Send

VICTIM = int(os.environ.get("FAULT_VICTIM", "{VICTIM}"))


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
        r.rpush(f"{{prefix}}:started", json.dumps([i, attempt, os.getpgid(0)]))
        mode = os.environ.get("FAULT_MODE", "")
        if i == VICTIM and mode == "hang" and attempt == 1:
            time.sleep(600)  # the test kills this worker here
        if i == VICTIM and mode == "exit":
            os._exit(1)  # a poison task: it kills the process running it, every time
        if i == VICTIM and mode == "long":
            time.sleep(float(os.environ["FAULT_LONG"]))
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
    """Worker subprocesses on a private queue, started on demand, and the run's executor."""

    tmp: Path
    name: str
    module: Any
    settings: Settings
    prefix: str
    redis: redis.Redis
    procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    logs: list[Path] = dataclasses.field(default_factory=list)

    def start(self, count: int, mode: str, **env: str) -> None:
        """Start ``count`` workers whose victim task behaves as ``mode`` says."""
        s = self.settings
        environ = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(self.tmp), os.environ.get("PYTHONPATH", "")]),
            "BULKSYNC_QUEUE": s.queue,
            "BULKSYNC_BROKER_URL": s.broker_url,
            "BULKSYNC_REDIS_URL": s.redis_url,
            "BULKSYNC_VISIBILITY_TIMEOUT": f"{s.visibility_timeout:g}",
            "BULKSYNC_CLAIM_LEASE": f"{s.claim_lease:g}",
            "BULKSYNC_CLAIM_HEARTBEAT": f"{s.claim_heartbeat:g}",
            "BULKSYNC_MAX_DELIVERIES": str(s.max_deliveries),
            "FAULT_PREFIX": self.prefix,
            "FAULT_MODE": mode,
            **env,
        }
        app = make_app(s)
        for _ in range(count):
            n = len(self.procs)
            hostname = f"{s.queue}-{n}@localhost"
            log = self.tmp / f"worker-{n}.log"
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [
                            *bulksync_command(),
                            "worker",
                            "--graph",
                            f"{self.name}:graph",
                            "--pool",
                            "prefork",
                            "--concurrency",
                            "1",
                            "--hostname",
                            hostname,
                        ],
                        env=environ,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # pgid == pid: kill -9 takes the whole worker
                    )
                )
            self.logs.append(log)
            wait_ready(app, self.procs[-1], hostname, log)

    def run(self, run_id: str = "") -> queue.Queue[Any]:
        """Invoke the graph on the fleet from a thread; its output (or error) lands in a queue."""
        graph = self.module.graph
        config = {"run_id": run_id} if run_id else None

        def invoke() -> Any:
            with CeleryExecutor(self.settings, f"{self.name}:graph", graph) as executor:
                return graph.with_executor(executor).invoke({"log": []}, config)

        return background(invoke)

    def outcome(self, out: queue.Queue[Any]) -> Any:
        try:
            return out.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"the run did not finish:\n{self.output()}")

    def output(self) -> str:
        return "\n".join(
            f"--- worker {i}\n{p.read_text(errors='replace')}" for i, p in enumerate(self.logs)
        )

    def counts(self, what: str) -> dict[int, int]:
        return counter(self.redis, self.prefix, what, TASKS)

    def undisturbed(self) -> Any:
        return self.module.graph.invoke({"log": []})  # in-process, nothing counted


@pytest.fixture
def fleet(tmp_path: Path, settings: Settings, redis_client: redis.Redis) -> Iterator[Fleet]:
    name = f"bulksync_it_delivery_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(GRAPH_MODULE))
    sys.path.insert(0, str(tmp_path))
    queue_name = f"bulksync-test-delivery-{uuid.uuid4().hex[:8]}"
    prefix = f"bulksync-test:{queue_name}"
    fleet_settings = dataclasses.replace(
        settings, queue=queue_name, claim_lease=LEASE, claim_heartbeat=LEASE / 3
    )
    fleet = Fleet(
        tmp_path, name, importlib.import_module(name), fleet_settings, prefix, redis_client
    )
    try:
        yield fleet
    finally:
        for proc in fleet.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # these tests leave no work worth a drain
        for proc in fleet.procs:
            proc.wait()
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        for key in redis_client.scan_iter(f"{prefix}:*", count=10_000):
            redis_client.delete(key)
        redis_client.delete(queue_name)


def started(fleet: Fleet, want: Any) -> tuple[int, int, int]:
    """Block until a start matching ``want(i, attempt)`` is reported; ``(i, attempt, pgid)``."""
    while True:
        item = fleet.redis.blpop([f"{fleet.prefix}:started"], timeout=WAIT)
        assert item is not None, f"no such task started:\n{fleet.output()}"
        i, attempt, pgid = json.loads(item[1])
        if want(i, attempt):
            return i, attempt, pgid


# -- item 4: a killed worker's task is dispatched again once its claim expires -----------


def test_killed_worker_task_runs_again_after_its_claim_lease(fleet: Fleet) -> None:
    # The visibility timeout stays at its default (an hour): only the claim brings it back.
    assert fleet.settings.visibility_timeout >= 3600
    fleet.start(2, "hang")
    out = fleet.run()
    _, _, pgid = started(fleet, lambda i, attempt: i == VICTIM and attempt == 1)
    os.killpg(pgid, signal.SIGKILL)
    result = fleet.outcome(out)
    assert not isinstance(result, BaseException), f"{result!r}\n{fleet.output()}"
    assert result == fleet.undisturbed()
    assert fleet.counts("finishes") == dict.fromkeys(range(TASKS), 1)
    assert fleet.counts("starts") == {i: 2 if i == VICTIM else 1 for i in range(TASKS)}


def test_task_longer_than_the_visibility_timeout_runs_once(fleet: Fleet) -> None:
    # The broker hands the long task's message to the other worker after 2 s; the claim,
    # renewed by heartbeats, keeps that second delivery from running it.
    fleet.settings = dataclasses.replace(fleet.settings, visibility_timeout=2.0)
    fleet.start(2, "long", FAULT_LONG="8")
    result = fleet.outcome(fleet.run())
    assert result == fleet.undisturbed(), fleet.output()
    assert fleet.counts("starts") == dict.fromkeys(range(TASKS), 1)
    assert fleet.counts("finishes") == dict.fromkeys(range(TASKS), 1)


# -- item 6: a poison task fails after max_deliveries ----------------------------------


def test_poison_task_fails_the_run_after_max_deliveries(fleet: Fleet) -> None:
    fleet.start(2, "exit")
    result = fleet.outcome(fleet.run())
    assert isinstance(result, WorkerLostError), f"{result!r}\n{fleet.output()}"
    assert result.node == "work"
    assert result.attempts == fleet.settings.max_deliveries == 3
    assert f"node 'work': task {result.task_id}" in str(result)
    assert "BULKSYNC_MAX_DELIVERIES" in str(result)
    assert fleet.counts("starts")[VICTIM] == 3
    others = {i: c for i, c in fleet.counts("finishes").items() if i != VICTIM}
    assert others == {i: 1 for i in range(TASKS) if i != VICTIM}


def test_a_poison_task_sharing_a_message_fails_the_run_after_max_deliveries(
    fleet: Fleet,
) -> None:
    # One message carries every task, the poison one first: each delivery reserves them all
    # and dies in the first. The dead process's claims are taken over by the next delivery;
    # no task after the poison one runs twice.
    fleet.settings = dataclasses.replace(fleet.settings, target_messages=1)
    fleet.start(2, "exit", FAULT_VICTIM="0")
    result = fleet.outcome(fleet.run())
    assert isinstance(result, WorkerLostError), f"{result!r}\n{fleet.output()}"
    assert result.attempts == fleet.settings.max_deliveries == 3
    starts = fleet.counts("starts")
    assert starts[0] == 3
    assert all(starts[i] <= 1 for i in range(1, TASKS)), starts


def test_a_poison_task_retried_at_once_from_its_checkpoint_gets_its_deliveries_afresh(
    fleet: Fleet,
) -> None:
    # The failed step deletes its delivery counts when it stops, before the run raises:
    # resumed at once from its checkpoint on the same executor, the run dispatches the step
    # again under the same slots, and the poison task starts three more times (not at once
    # refused). The tasks that finished are not run again.
    fleet.start(2, "exit")
    graph = fleet.module.builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"poison-{uuid.uuid4().hex}"}}

    def twice() -> tuple[Any, Any]:
        with CeleryExecutor(fleet.settings, f"{fleet.name}:graph", graph) as executor:
            on_fleet, outcomes = graph.with_executor(executor), []
            for value in ({"log": []}, None):
                try:
                    outcomes.append(on_fleet.invoke(value, config))
                except Exception as exc:
                    outcomes.append(exc)
            return outcomes[0], outcomes[1]

    first, again = fleet.outcome(background(twice))
    assert isinstance(first, WorkerLostError), f"{first!r}\n{fleet.output()}"
    assert isinstance(again, WorkerLostError), f"{again!r}\n{fleet.output()}"
    assert again.task_id == first.task_id
    assert fleet.counts("starts")[VICTIM] == 6
    others = {i: c for i, c in fleet.counts("finishes").items() if i != VICTIM}
    assert others == {i: 1 for i in range(TASKS) if i != VICTIM}


# -- item 5: a lost message is published again -----------------------------------------


def test_message_lost_from_the_broker_is_published_again(fleet: Fleet) -> None:
    fleet.settings = dataclasses.replace(fleet.settings, unstarted_grace=2.0)
    with redis.Redis.from_url(fleet.settings.broker_url) as broker:
        out = fleet.run()  # no worker yet: the first step's one message waits in the queue
        deadline = time.monotonic() + WAIT
        while broker.llen(fleet.settings.queue) < 1:
            assert time.monotonic() < deadline, "the step's message was never queued"
            time.sleep(0.05)  # waiting for the coordinator's publishing thread
        assert broker.lpop(fleet.settings.queue) is not None  # the message is lost
    fleet.start(1, "")
    result = fleet.outcome(out)
    assert result == fleet.undisturbed(), fleet.output()
    assert fleet.counts("finishes") == dict.fromkeys(range(TASKS), 1)


# -- item 10: a cancelled run's running task is stopped, its slot freed --------------------


def test_cancel_terminates_the_running_task_and_frees_its_slot(fleet: Fleet) -> None:
    fleet.start(1, "hang")  # one worker, one pool process: the hung task holds the only slot
    run_id = f"hung-{uuid.uuid4().hex}"
    out = fleet.run(run_id)
    started(fleet, lambda i, attempt: i == VICTIM and attempt == 1)
    cancel_run(fleet.redis, run_id, fleet.settings)
    result = fleet.outcome(out)
    assert isinstance(result, TaskCancelledError), f"{result!r}\n{fleet.output()}"
    # The next run gets the slot (the victim does not hang on its second attempt).
    assert fleet.outcome(fleet.run()) == fleet.undisturbed(), fleet.output()
    assert fleet.counts("finishes")[VICTIM] == 1
