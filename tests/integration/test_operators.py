"""What operators see of a real cluster: failures, logs, malformed messages, Flower.

Two ``bulksync worker`` subprocesses (prefork; the second logs JSON) serve a graph written to
a temporary module, on a queue of this module's own. Every node appends a line to a file
named after it, so a test can count how often each node ran to the end (or to its error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bulksync.client import Client
from bulksync.errors import NodeTimeoutError, SerializationError
from bulksync.service import events
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor
from tests.integration.test_publish import events as published_events
from tests.integration.test_publish import listening
from tests.integration.test_worker_process import (
    WorkerProcess,
    bulksync_command,
    start_worker,
    stop,
    wait_ready,
    worker_env,
    write_graph_module,
)

pytestmark = pytest.mark.integration

WAIT = 60.0
"""Longest a test waits for an event, a run or a process (a liveness bound, not a measure)."""

GRAPH_MODULE = '''
"""Graphs whose nodes fail in each way a node can, for tests of what operators see."""

import asyncio
import os
from typing import Any, TypedDict

from bulksync.graph import END, START, StateGraph
from bulksync.types import Send

HERE = os.path.dirname(os.path.abspath(__file__))


class State(TypedDict, total=False):
    kind: str
    value: Any


def ran(node: str) -> None:
    with open(os.path.join(HERE, node + ".ran"), "a") as out:
        out.write("x")


def route(state: State) -> list[Send]:
    return [Send(state["kind"], state)]


def fine(state: State) -> dict[str, Any]:
    ran("fine")
    return {"value": 42}


def explode(state: State) -> dict[str, Any]:
    ran("explode")
    raise ValueError("boom from explode")


def unstorable(state: State) -> dict[str, Any]:
    ran("unstorable")
    return {"value": object()}


async def slow(state: State) -> dict[str, Any]:
    ran("slow")
    await asyncio.sleep(2.5)
    return {"value": "late"}


builder = StateGraph(State)
builder.add_node("fine", fine)
builder.add_node("explode", explode)
builder.add_node("unstorable", unstorable)
builder.add_node("slow", slow, timeout=1)
builder.add_conditional_edges(START, route, ["fine", "explode", "unstorable", "slow"])
for name in ("fine", "explode", "unstorable", "slow"):
    builder.add_edge(name, END)
graph = builder.compile()
'''


@dataclasses.dataclass
class Fleet:
    """Two worker subprocesses serving one graph module on a queue of their own."""

    directory: Path
    module: Any
    settings: Settings
    workers: list[WorkerProcess]
    env: dict[str, str]
    executor: CeleryExecutor  # the fleet's, for the graph run in this process

    @property
    def graph_id(self) -> str:
        return f"{self.module.__name__}:graph"

    def attached(self) -> Any:
        """The module's graph, its tasks run by the fleet."""
        return self.module.graph.with_executor(self.executor)

    def ran(self, node: str) -> int:
        """How many times ``node`` ran (to its end or its error)."""
        path = self.directory / f"{node}.ran"
        return len(path.read_text()) if path.exists() else 0

    def output(self) -> str:
        return "".join(w.output() for w in self.workers)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, redis_url: str
) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("operators")
    name = write_graph_module(directory, GRAPH_MODULE)
    sys.path.insert(0, str(directory))
    module = importlib.import_module(name)
    queue = f"bulksync-test-ops-{uuid.uuid4().hex[:8]}"
    # A task's events are held this long, to be sent together: far longer than the task,
    # so that its events share a message on a slow machine too.
    env = worker_env(directory, settings, queue, BULKSYNC_EVENTS_HOLD="1")
    fleet_settings = dataclasses.replace(settings, queue=queue)
    workers: list[WorkerProcess] = []
    app = make_app(fleet_settings)
    try:
        for i, log_format in enumerate(("text", "json")):
            hostname = f"w{i}-{queue}@localhost"
            env_i = {**env, "BULKSYNC_LOG_FORMAT": log_format}
            workers.append(start_worker(directory, module, fleet_settings, env_i, hostname))
        for worker in workers:
            wait_ready(app, worker)
        with CeleryExecutor(fleet_settings, f"{name}:graph", module.graph, app=app) as executor:
            yield Fleet(directory, module, fleet_settings, workers, env, executor)
    finally:
        app.close()
        for worker in workers:
            stop(worker)
        sys.path.remove(str(directory))
        sys.modules.pop(name, None)


# -- Celery events -------------------------------------------------------------------------


class Events:
    """Task events of the fleet's workers, captured on a thread while the block runs."""

    def __init__(self, settings: Settings, hostnames: list[str]) -> None:
        self.app = make_app(settings)
        self.hostnames = set(hostnames)
        self.names: dict[str, str] = {}  # message id -> task name
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.receiver: Any = None
        self.ready = threading.Event()

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("hostname") not in self.hostnames:
            return
        with self.lock:
            if event.get("name"):
                self.names[event["uuid"]] = event["name"]
            self.seen.append(event)

    def run(self) -> None:
        with self.app.connection() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"*": self.on_event})
            self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def of(self, kind: str, node: str) -> list[dict[str, Any]]:
        """Events of type ``kind`` for messages of ``node``."""
        with self.lock:
            return [
                e
                for e in self.seen
                if e["type"] == kind and self.names.get(e["uuid"], "").endswith(f".{node}")
            ]


@contextlib.contextmanager
def captured(fleet: Fleet) -> Iterator[Events]:
    events = Events(fleet.settings, [w.hostname for w in fleet.workers])
    thread = threading.Thread(target=events.run, daemon=True)
    thread.start()
    assert events.ready.wait(WAIT)
    time.sleep(0.5)  # the receiver's queue is bound once capture() consumes
    try:
        yield events
    finally:
        events.receiver.should_stop = True
        thread.join(WAIT)


def wait_until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def unacked_ids(settings: Settings) -> set[str]:
    """Message ids a Redis broker holds as delivered but not acknowledged."""
    with redis.Redis.from_url(settings.broker_url) as client:
        unacked = client.hvals("unacked")
    found = set()
    for raw in unacked:
        with contextlib.suppress(ValueError, KeyError, IndexError):
            found.add(json.loads(raw)[0]["headers"]["id"])
    return found


# -- item 14: failures are Celery FAILUREs, recorded first, never redelivered ---------------


def test_node_errors_are_celery_failures_recorded_first(fleet: Fleet) -> None:
    graph = fleet.attached()
    with captured(fleet) as events:
        with pytest.raises(ValueError, match="boom from explode") as info:
            graph.invoke({"kind": "explode"})
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "During task with name 'explode'" in notes  # the node is named (item 12)
        with pytest.raises(SerializationError, match="unstorable"):
            graph.invoke({"kind": "unstorable"})
        with pytest.raises(NodeTimeoutError, match="slow"):
            graph.invoke({"kind": "slow"})
        assert graph.invoke({"kind": "fine"})["value"] == 42
        failures = {
            node: wait_until(lambda n=node: events.of("task-failed", n), f"{node} to fail")
            for node in ("explode", "unstorable", "slow")
        }
        wait_until(lambda: events.of("task-succeeded", "fine"), "fine to succeed")

    assert "NodeFailedError" in failures["explode"][0]["exception"]
    assert "ValueError: boom from explode" in failures["explode"][0]["exception"]
    assert "SerializationError" in failures["unstorable"][0]["exception"]
    assert "NodeTimeoutError" in failures["slow"][0]["exception"]
    for node in ("explode", "unstorable", "slow"):
        assert not events.of("task-succeeded", node), f"{node} was reported as a success"
    # Acknowledged like any message: no redelivery, each node ran exactly once.
    ids = {e["uuid"] for node in failures for e in failures[node]}
    assert not ids & unacked_ids(fleet.settings)
    with redis.Redis.from_url(fleet.settings.broker_url) as broker:
        assert broker.llen(fleet.settings.queue) == 0
    assert {n: fleet.ran(n) for n in ("explode", "unstorable", "slow", "fine")} == {
        "explode": 1,
        "unstorable": 1,
        "slow": 1,
        "fine": 1,
    }
    # Workers log each node error with its ids; the JSON worker's lines all parse.
    assert "node explode task" in fleet.output() or '"node": "explode"' in fleet.output()
    for line in fleet.workers[1].output().splitlines():
        json.loads(line)


@contextlib.contextmanager
def sent_by(settings: Settings, hostnames: set[str]) -> Iterator[list[list[dict[str, Any]]]]:
    """The messages of task events the workers ``hostnames`` send while the block runs, as
    they are published (the events of each), gathered on a thread."""
    sent: list[list[dict[str, Any]]] = []
    done = threading.Event()

    def listen(listener: Any) -> None:
        while not done.is_set():
            got = listener.get_message(timeout=0.1)
            if got is None:
                continue
            envelope, published = published_events(got["data"])
            tasks = [e for e in published if "uuid" in e]
            if envelope["headers"]["hostname"] in hostnames and tasks:
                sent.append(tasks)

    with listening(settings.broker_url, "*celeryev*") as listener:
        thread = threading.Thread(target=listen, args=(listener,), daemon=True)
        thread.start()
        try:
            yield sent
        finally:
            done.set()
            thread.join(WAIT)


def by_task(sent: list[list[dict[str, Any]]]) -> dict[str, list[tuple[int, str]]]:
    """Each task's events (by message id): the index of the message it rode in, its type."""
    tasks: dict[str, list[tuple[int, str]]] = {}
    for i, message in enumerate(sent):
        for event in message:
            tasks.setdefault(event["uuid"], []).append((i, event["type"]))
    return tasks


def test_a_workers_task_events_are_sent_together(fleet: Fleet) -> None:
    """A worker holds its task events (``BULKSYNC_EVENTS_HOLD``) and sends them as one
    message: a task's received, started and succeeded events ride together (Celery would
    send each at its loop's next turn, a message each)."""
    with sent_by(fleet.settings, {w.hostname for w in fleet.workers}) as sent:
        assert fleet.attached().invoke({"kind": "fine"})["value"] == 42  # __start__, fine
        wait_until(lambda: str(sent).count("task-succeeded") == 2, "both tasks' events")
    # Each task's three events ride in one message (its first: offsets 0).
    together = [(0, "task-received"), (0, "task-started"), (0, "task-succeeded")]
    tasks = by_task(sent).values()
    assert [[(i - t[0][0], kind) for i, kind in t] for t in tasks] == [together] * 2, sent


def test_a_stopping_worker_sends_the_task_events_it_holds(fleet: Fleet) -> None:
    """A worker stopped (warm shutdown) while it holds task events sends them first, so
    that Flower sees its last tasks end."""
    queue = f"{fleet.settings.queue}-stopping"
    settings = dataclasses.replace(fleet.settings, queue=queue)
    env = {**fleet.env, "BULKSYNC_QUEUE": queue, "BULKSYNC_EVENTS_HOLD": "600"}
    app = make_app(settings)
    worker = start_worker(fleet.directory, fleet.module, settings, env, f"s-{queue}@localhost")
    try:
        wait_ready(app, worker)
        with (
            sent_by(settings, {worker.hostname}) as sent,
            CeleryExecutor(settings, fleet.graph_id, fleet.module.graph, app=app) as executor,
        ):
            assert fleet.module.graph.with_executor(executor).invoke({"kind": "fine"})["value"]
            time.sleep(0.5)
            assert sent == []  # held for ten minutes
            assert stop(worker) == 0
            wait_until(lambda: sent, "the held events")
        # One message, each task's three events in order (the next task's message may reach
        # the worker before the one before it is marked done: their events interleave).
        assert len(sent) == 1, by_task(sent)
        assert (
            list(by_task(sent).values())
            == [[(0, "task-received"), (0, "task-started"), (0, "task-succeeded")]] * 2
        )
    finally:
        stop(worker)
        app.close()


# -- item 14: the coordinator's lifecycle, in JSON ----------------------------------------


@pytest.fixture
def coordinator(fleet: Fleet, pg_schema: str) -> Iterator[tuple[Path, Settings]]:
    log = fleet.directory / f"coordinator-{uuid.uuid4().hex[:6]}.log"
    env = {**fleet.env, "BULKSYNC_DATABASE_URL": pg_schema, "BULKSYNC_LOG_FORMAT": "json"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *bulksync_command(),
                "coordinator",
                "--graph",
                fleet.graph_id,
                "--poll-interval",
                "0.2",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with redis.Redis.from_url(fleet.settings.redis_url) as conn:
            # Up once it announces its graph; submitting earlier would be refused.
            wait_until(lambda: events.serving(conn, fleet.graph_id) > 0, "the coordinator's start")
        yield log, dataclasses.replace(fleet.settings, database_url=pg_schema)
    finally:
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_coordinator_logs_each_run_in_json_lines(
    fleet: Fleet, coordinator: tuple[Path, Settings]
) -> None:
    log, settings = coordinator
    with Client(settings) as client:
        good = client.submit(fleet.graph_id, {"kind": "fine"}, thread_id="ops-good")
        bad = client.submit(fleet.graph_id, {"kind": "explode"}, thread_id="ops-bad")
        assert client.wait(good, timeout=WAIT).status == "success"
        failed = client.wait(bad, timeout=WAIT)
    assert failed.status == "error"
    # Item 12: the run's error text names the node and its task.
    assert f"During task with name 'explode' and id '{failure_task(log, bad)}'" in (
        failed.error or ""
    )

    def finished() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        ends = {e.get("run_id") for e in lines if "finished" in e["message"]}
        return lines if {good, bad} <= ends else []

    lines = wait_until(finished, "the coordinator's finish lines")
    for run_id, thread in ((good, "ops-good"), (bad, "ops-bad")):
        mine = [e for e in lines if e.get("run_id") == run_id]
        assert all(e.get("thread_id") == thread for e in mine)
        messages = [e["message"] for e in mine]
        assert any("claimed by" in m for m in messages)
        assert any("step 0 dispatched 1 tasks" in m for m in messages)
    (good_end,) = [e for e in lines if e.get("run_id") == good and "finished" in e["message"]]
    assert good_end["level"] == "INFO" and "finished success in" in good_end["message"]
    (bad_end,) = [e for e in lines if e.get("run_id") == bad and "finished" in e["message"]]
    assert bad_end["level"] == "WARNING" and "finished error in" in bad_end["message"]
    (failure,) = [e for e in lines if e.get("run_id") == bad and e.get("node") == "explode"]
    assert failure["level"] == "WARNING" and "ValueError: boom from explode" in failure["message"]
    # The worker that ran it logged the same ids.
    worker_lines = [
        line
        for w in fleet.workers
        for line in w.output().splitlines()
        if failure["task_id"] in line and "failed" in line
    ]
    assert worker_lines and all(bad in line and "ops-bad" in line for line in worker_lines)


def failure_task(log: Path, run_id: str) -> str:
    """The task id of the coordinator's failure line about ``run_id``."""

    def find() -> str:
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("run_id") == run_id and entry.get("task_id"):
                return str(entry["task_id"])
        return ""

    found: str = wait_until(find, "the coordinator's failure line")
    return found


# -- item 12: clear errors where raw ones were ----------------------------------------------


def test_nul_in_a_thread_id_is_refused_before_postgres(
    fleet: Fleet, coordinator: tuple[Path, Settings]
) -> None:
    from bulksync.errors import ConfigError

    _, settings = coordinator
    with Client(settings) as client:
        with pytest.raises(ConfigError, match=r"thread_id .* NUL byte"):
            client.submit(fleet.graph_id, {"kind": "fine"}, thread_id="bad\x00thread")
        with pytest.raises(ConfigError, match=r"graph_id .* NUL byte"):
            client.submit(fleet.graph_id + "\x00", {"kind": "fine"})
        assert client.list_runs() == []  # nothing half-created
        run = client.submit(fleet.graph_id, {"kind": "fine"}, thread_id="good-thread")
        assert client.wait(run, timeout=WAIT).status == "success"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def basic_auth_get(url: str, user: str = "admin", password: str = "secret") -> Any:
    token = b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


# -- item 15: `bulksync flower` shows workers, the queue and node tasks --------------------


@pytest.fixture
def flower(fleet: Fleet) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = fleet.directory / "flower.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*bulksync_command(), "flower", f"--port={port}", "--address=127.0.0.1"],
            env={**fleet.env, "FLOWER_BASIC_AUTH": "admin:secret"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"bulksync flower exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/healthcheck", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_until(healthy, "Flower to answer its health check")
        yield base, log
    finally:
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_bulksync_flower_shows_workers_queue_and_node_tasks(
    fleet: Fleet, flower: tuple[str, Path]
) -> None:
    base, flower_log = flower
    mark = {w.hostname: len(w.output()) for w in fleet.workers}
    hostnames = {w.hostname for w in fleet.workers}

    def workers() -> bool:
        return hostnames <= set(basic_auth_get(f"{base}/api/workers?refresh=1"))

    wait_until(workers, "Flower to list both workers")
    time.sleep(1.0)  # Flower's event capture is running by now; the tasks below are seen
    graph = fleet.attached()
    assert graph.invoke({"kind": "fine"})["value"] == 42
    with pytest.raises(ValueError, match="boom from explode"):
        graph.invoke({"kind": "explode"})

    def states() -> dict[str, str]:
        tasks = basic_auth_get(f"{base}/api/tasks?limit=1000")
        found = {
            t["name"].rsplit(".", 1)[-1]: t["state"]
            for t in tasks.values()
            if (t.get("name") or "").startswith(fleet.graph_id)
        }
        return found if {"fine", "explode"} <= {n for n, s in found.items() if s in DONE} else {}

    found = wait_until(states, "Flower to list the node tasks")
    assert found["fine"] == "SUCCESS"
    assert found["explode"] == "FAILURE"
    failed = [
        t
        for t in basic_auth_get(f"{base}/api/tasks?state=FAILURE&limit=1000").values()
        if t.get("name") == f"{fleet.graph_id}.explode"
    ]
    assert failed and "ValueError: boom from explode" in failed[0]["exception"]
    queues = basic_auth_get(f"{base}/api/queues/length")["active_queues"]
    assert fleet.settings.queue in {q["name"] for q in queues}
    # No side logged an error: the workers accepted every control message Flower sent.
    for worker in fleet.workers:
        text = worker.output()[mark[worker.hostname] :]
        assert "untrusted content" not in text, text
    assert "Traceback" not in flower_log.read_text(), flower_log.read_text()


DONE = {"SUCCESS", "FAILURE"}


# -- item 9: a malformed message is dropped, not a crash loop ------------------------------


def test_malformed_message_is_rejected_once_and_workers_go_on(fleet: Fleet) -> None:
    from kombu import Connection

    from bulksync.workers.celery.node_task import MESSAGE_HEADER

    message_id = uuid.uuid4().hex
    headers = {
        MESSAGE_HEADER: fleet.graph_id,
        "task": f"{fleet.graph_id}.no_such_node",
        "id": message_id,
        "lang": "py",
        "root_id": message_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "eta": None,
        "expires": None,
        "timelimit": [None, None],
        "argsrepr": "",
        "kwargsrepr": "{}",
        "origin": "tests",
    }
    body = [[fleet.graph_id, []], {}, {"callbacks": None, "errbacks": None, "chain": None}]
    with Connection(fleet.settings.broker_url) as conn:
        conn.Producer(serializer="msgpack").publish(
            body, routing_key=fleet.settings.queue, exchange="", headers=headers
        )

    def handled() -> bool:
        return message_id in fleet.output() or any(w.proc.poll() is not None for w in fleet.workers)

    wait_until(handled, "a worker to handle the malformed message")
    assert all(w.proc.poll() is None for w in fleet.workers), fleet.output()
    # Logged once, naming the message; rejected without requeue: nowhere in the broker.
    lines = [line for line in fleet.output().splitlines() if message_id in line]
    assert len(lines) == 1 and "rejected" in lines[0] and "arguments" in lines[0], lines
    with redis.Redis.from_url(fleet.settings.broker_url) as broker:
        assert broker.llen(fleet.settings.queue) == 0
    assert message_id not in unacked_ids(fleet.settings)
    # And the workers go on running graphs.
    assert fleet.attached().invoke({"kind": "fine"})["value"] == 42
    assert all(w.proc.poll() is None for w in fleet.workers), fleet.output()
