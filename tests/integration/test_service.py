"""The coordinator service driving detached runs on real Postgres, Redis and Celery workers.

Each test gets its own Postgres schema and coordinators running in this process (on threads),
whose node tasks the session's in-process Celery worker (``cluster``) runs. The helpers at the
top (``Service``, the ``service`` fixture) are imported by ``test_client.py`` too.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import operator
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Annotated, Any, TypedDict

import pytest
import redis

from bulksync import keys
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.cli import main
from bulksync.client import Client
from bulksync.coordinator.executor import Executor, StepInput, StepLive, TaskResult
from bulksync.coordinator.loop import SuperstepLoop
from bulksync.demo import build_demo_graph, demo_input
from bulksync.errors import (
    ConfigError,
    TaskCancelledError,
    ThreadBusyError,
    UnservedGraphError,
)
from bulksync.graph import END, START, StateGraph
from bulksync.service import events, runs
from bulksync.service.coordinator import Coordinator, ExecutorFactory
from bulksync.service.driver import RunDriver
from bulksync.service.runs import RunStore
from bulksync.settings import Settings
from bulksync.types import Command, Send, interrupt
from bulksync.workers.celery.executor import CeleryExecutor
from bulksync.workers.registry import GraphRegistry

pytestmark = pytest.mark.integration

WAIT = 30.0  # seconds a test waits for a run before failing (never reached when all is well)


class Service:
    """Coordinators of one test, sharing its schema, registry and the session's worker."""

    def __init__(self, cluster: Any, settings: Settings, stack: ExitStack) -> None:
        self.cluster = cluster
        self.settings = settings
        self.stack = stack
        self.registry = GraphRegistry()
        self.client = stack.enter_context(Client(settings))
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.prefix = f"test:{uuid.uuid4().hex[:10]}"

    def register(self, graph: Any) -> str:
        """Serve ``graph`` on the worker and the coordinators; its graph id."""
        graph_id = self.cluster.register(graph)
        if graph_id not in self.registry:
            self.registry.add(graph_id, graph)
        return graph_id

    def start(
        self, executor_factory: ExecutorFactory | None = None, **tunables: Any
    ) -> Coordinator:
        """A coordinator serving on a thread until the test ends (or it is stopped).

        ``tunables`` are settings of the coordinator group (``heartbeat=0.2``, …).
        """
        coordinator = self.coordinator(executor_factory, **tunables)
        coordinator.start()
        return coordinator

    def coordinator(
        self, executor_factory: ExecutorFactory | None = None, **tunables: Any
    ) -> Coordinator:
        """A coordinator not serving yet, stopped when the test ends (``start``'s)."""
        tunables.setdefault("heartbeat", 0.2)
        tunables.setdefault("poll_interval", 0.2)
        settings = dataclasses.replace(self.settings, **tunables)
        saver = self.stack.enter_context(
            PostgresSaver.from_conn_string(self.settings.database_url, max_size=8)
        )
        saver.setup()
        coordinator = Coordinator(
            settings,
            self.registry,
            RunStore(saver.pool),
            saver,
            app=self.cluster.app,
            executor_factory=executor_factory,
        )
        self.stack.callback(coordinator.stop, timeout=WAIT)
        return coordinator

    def key(self, name: str) -> str:
        """A Redis key of this test only."""
        return f"{self.prefix}:{name}"

    def gate(self, name: str) -> Callable[[], None]:
        """A function that blocks until ``open_gate(name)`` (for nodes to wait on)."""
        key, url = self.key(name), self.settings.redis_url

        def wait() -> None:
            with redis.Redis.from_url(url) as client:
                client.blpop([key], timeout=WAIT)

        return wait

    def open_gate(self, name: str, times: int = 1) -> None:
        """Let ``times`` waiters of gate ``name`` through."""
        self.redis.rpush(self.key(name), *([b"1"] * times))

    def count(self, name: str) -> int:
        """The value of counter ``name`` (``INCR``-ed by nodes)."""
        return int(self.redis.get(self.key(name)) or 0)


@pytest.fixture
def service(cluster: Any, pg_schema: str) -> Iterator[Service]:
    settings = dataclasses.replace(cluster.settings, database_url=pg_schema)
    with ExitStack() as stack:
        svc = Service(cluster, settings, stack)
        yield svc
        svc.redis.delete(*(svc.redis.keys(f"{svc.prefix}:*") or [svc.prefix]))
        svc.redis.close()


class Counter(TypedDict, total=False):
    """A state that only grows: each node appends its name."""

    log: Annotated[list[str], operator.add]
    answer: str


def chain_graph(svc: Service, *, gate: str | None = None, fail: bool = False) -> Any:
    """``first`` → ``second`` (waits on ``gate``, raises if ``fail``); both count their runs,
    and ``second`` reports on list ``entered`` when it starts."""
    r = svc.redis  # closed with the test: a client of the graph's own would leak its socket
    wait = svc.gate(gate) if gate else None

    def first(state: Counter) -> dict[str, Any]:
        r.incr(svc.key("first"))
        return {"log": ["first"]}

    def second(state: Counter) -> dict[str, Any]:
        r.incr(svc.key("second"))
        r.rpush(svc.key("entered"), b"second")
        if wait is not None:
            wait()
        if fail:
            raise KeyError("second failed on purpose")
        return {"log": ["second"]}

    builder: StateGraph[Counter] = StateGraph(Counter)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile()


def ask_graph() -> Any:
    """One node that interrupts with a question and stores the answer."""

    def ask(state: Counter) -> dict[str, Any]:
        return {"answer": interrupt("what is the answer?"), "log": ["ask"]}

    builder: StateGraph[Counter] = StateGraph(Counter)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


# --- submit, wait, statuses -----------------------------------------------------------------


def test_submit_wait_gives_the_local_final_state(service: Service) -> None:
    graph = build_demo_graph().compile()
    graph_id = service.register(graph)
    service.start()
    run_id = service.client.submit(graph_id, demo_input(12))
    run = service.client.wait(run_id, timeout=WAIT)
    assert run.status == runs.SUCCESS, run.error
    assert run.output == graph.invoke(demo_input(12))
    assert run.kind == "invoke" and run.graph_id == graph_id and run.error is None


def test_a_runs_last_chunks_precede_its_end_event(service: Service) -> None:
    # The loop's last chunks wait for the end, to be written in its round trip.
    graph_id = service.register(chain_graph(service))
    service.start()
    run_id = service.client.submit(graph_id, {"log": ["in"]}, stream_mode=["values", "updates"])
    run = service.client.wait(run_id, timeout=WAIT)
    read = service.client.stream(run_id)
    streamed = [(e.mode, e.chunk) for e in read if e.mode != events.PROGRESS]
    assert [mode for mode, _ in streamed[-3:]] == ["updates", "values", events.END]
    assert streamed[-3][1] == {"second": {"log": ["second"]}}
    assert streamed[-2][1] == run.output == {"log": ["in", "first", "second"]}
    end = streamed[-1][1]
    assert (end["status"], end["error"]) == (runs.SUCCESS, None)
    assert events.ended_run(end, run_id) == run == service.client.get(run_id)


def test_a_finished_run_leaves_no_garbage_on_its_coordinator(service: Service) -> None:
    # A busy coordinator must not pile up its finished runs until a full collection walks
    # them all (a pause of every run it drives): reference counting alone frees each one.
    def live() -> int:
        return sum(isinstance(o, (RunDriver, SuperstepLoop)) for o in gc.get_objects())

    graph_id = service.register(chain_graph(service))
    service.start()
    gc.collect()
    gc.disable()
    try:
        for i in range(3):
            run_id = service.client.submit(graph_id, {"log": [f"in{i}"]})
            assert service.client.wait(run_id, timeout=WAIT).status == runs.SUCCESS
        deadline = time.monotonic() + WAIT
        while live() and time.monotonic() < deadline:
            time.sleep(0.05)  # the last driver closes just after its end event
        assert live() == 0
    finally:
        gc.enable()


def test_runs_on_one_thread_are_queued_in_order(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    service.start()
    thread = f"t-{uuid.uuid4().hex[:6]}"
    ids = [service.client.submit(graph_id, {"log": [f"in{i}"]}, thread_id=thread) for i in range(3)]
    finished = [service.client.wait(i, timeout=WAIT) for i in ids]
    assert [r.status for r in finished] == [runs.SUCCESS] * 3
    # Each run saw the state the previous one left: enqueued, never interleaved.
    assert finished[-1].output["log"] == [
        *("in0", "first", "second"),
        *("in1", "first", "second"),
        *("in2", "first", "second"),
    ]
    assert sorted(r.created_at for r in finished) == [r.created_at for r in finished]


def test_reject_refuses_a_busy_thread_and_names_the_active_run(service: Service) -> None:
    graph_id = service.register(chain_graph(service, gate="go"))
    service.start()
    first = service.client.submit(graph_id, {"log": []}, thread_id="busy")
    with pytest.raises(ThreadBusyError, match=rf"thread 'busy' is busy with run {first}"):
        service.client.submit(graph_id, {"log": []}, thread_id="busy", multitask_strategy="reject")
    service.open_gate("go")
    assert service.client.wait(first, timeout=WAIT).status == runs.SUCCESS
    again = service.client.submit(
        graph_id, {"log": []}, thread_id="busy", multitask_strategy="reject"
    )
    service.open_gate("go")
    assert service.client.wait(again, timeout=WAIT).status == runs.SUCCESS


def test_max_runs_bounds_the_runs_driven_at_once(service: Service) -> None:
    graph_id = service.register(chain_graph(service, gate="go"))
    coordinator = service.start(max_runs=1)
    first = service.client.submit(graph_id, {"log": []}, thread_id="m1")
    second = service.client.submit(graph_id, {"log": []}, thread_id="m2")
    assert service.redis.blpop([service.key("entered")], timeout=WAIT)  # `first` is running
    assert coordinator.active == [first]
    assert service.client.get(second).status == runs.PENDING
    service.open_gate("go", 2)
    assert [service.client.wait(r, timeout=WAIT).status for r in (first, second)] == [
        runs.SUCCESS,
        runs.SUCCESS,
    ]


def test_heartbeats_never_overlap(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    # The serve loop and the heartbeat thread both beat; two renewals of the same lease rows
    # at once could deadlock in Postgres, so the coordinator lets one through at a time.
    renew = PostgresSaver.renew_leases
    inside, most, calls = [0], [0], [0]

    def slow_renew(saver: PostgresSaver, *args: Any) -> set[str]:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        calls[0] += 1
        time.sleep(0.05)  # long enough for the other beat to arrive meanwhile
        inside[0] -= 1
        return renew(saver, *args)

    monkeypatch.setattr(PostgresSaver, "renew_leases", slow_renew)
    graph_id = service.register(chain_graph(service, gate="go"))
    service.start(heartbeat=0.05)
    run_id = service.client.submit(graph_id, {"log": []}, thread_id="beats")
    assert service.redis.blpop([service.key("entered")], timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while calls[0] < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    service.open_gate("go")
    assert service.client.wait(run_id, timeout=WAIT).status == runs.SUCCESS
    assert calls[0] >= 20 and most[0] == 1


@pytest.mark.parametrize("option", ["max_runs", "heartbeat", "poll_interval"])
def test_coordinator_options_must_be_positive(service: Service, option: str) -> None:
    with pytest.raises(ConfigError, match=f"BULKSYNC_{option.upper()}=0: set it to a positive"):
        service.start(**{option: 0})


def test_a_failing_node_ends_the_run_with_its_error(service: Service) -> None:
    graph_id = service.register(chain_graph(service, fail=True))
    service.start()
    run = service.client.wait(service.client.submit(graph_id, {"log": []}), timeout=WAIT)
    assert run.status == runs.ERROR
    assert run.error is not None and "second failed on purpose" in run.error
    error = run.exception()
    assert isinstance(error, KeyError) and "second failed on purpose" in str(error)


def test_a_coordinator_takes_only_runs_of_its_graphs(service: Service) -> None:
    known = service.register(chain_graph(service))
    service.start()
    stranger = service.client.submit("no.such:graph", {}, require_coordinator=False)
    mine = service.client.submit(known, {"log": []})
    assert service.client.wait(mine, timeout=WAIT).status == runs.SUCCESS
    with pytest.raises(TimeoutError, match=f"run {stranger} did not finish in time"):
        service.client.wait(stranger, timeout=0.5)
    assert service.client.get(stranger).status == runs.PENDING


def test_a_run_of_a_graph_no_coordinator_serves_is_refused_at_once(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    thread = f"unserved-{uuid.uuid4().hex[:8]}"
    with pytest.raises(UnservedGraphError, match=f"no coordinator serves graph '{graph_id}'"):
        service.client.submit(graph_id, {"log": []}, thread_id=thread)
    assert service.client.list_runs(thread_id=thread) == []  # nothing was queued
    service.start()
    run_id = service.client.submit(graph_id, {"log": []}, thread_id=thread)
    assert service.client.wait(run_id, timeout=WAIT).status == runs.SUCCESS


def test_a_stopped_coordinator_withdraws_and_a_dead_ones_claim_lapses(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    coordinator = service.start()
    assert events.serving(service.redis, graph_id) == 1
    coordinator.stop(timeout=WAIT)
    assert events.serving(service.redis, graph_id) == 0
    # A coordinator killed mid-heartbeat never withdraws: its claim lapses on its own.
    events.announce(service.redis, [graph_id], "killed", ttl=0.3)
    assert events.serving(service.redis, graph_id) == 1
    deadline = time.monotonic() + WAIT
    while events.serving(service.redis, graph_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert events.serving(service.redis, graph_id) == 0


def test_a_heartbeat_held_up_by_the_database_does_not_make_clients_refuse_runs(
    service: Service,
) -> None:
    graph_id = service.register(chain_graph(service))
    coordinator = service.start()  # heartbeat 0.2 s: stale_after 0.6 s
    renew = coordinator.saver.renew_leases

    def slow_renew(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)  # a Postgres call held up on a loaded machine
        return renew(*args, **kwargs)

    coordinator.saver.renew_leases = slow_renew  # type: ignore[method-assign]
    time.sleep(0.4)  # the heartbeat thread is in its slow call
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert events.serving(service.redis, graph_id) == 1
        time.sleep(0.05)
    run_id = service.client.submit(graph_id, {"log": []})
    assert service.client.wait(run_id, timeout=WAIT).status == runs.SUCCESS


# --- cancel -------------------------------------------------------------------------------


def test_cancel_a_pending_run_at_once(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    run_id = service.client.submit(graph_id, {"log": []}, require_coordinator=False)
    assert service.client.cancel(run_id).status == runs.CANCELLED
    run = service.client.wait(run_id, timeout=WAIT)
    assert run.status == runs.CANCELLED
    assert isinstance(run.exception(), TaskCancelledError)
    service.start()
    other = service.client.wait(service.client.submit(graph_id, {"log": []}), timeout=WAIT)
    assert other.status == runs.SUCCESS
    assert service.count("first") == 1  # the cancelled run never ran


def test_cancel_a_running_run_stops_it(service: Service) -> None:
    graph_id = service.register(chain_graph(service, gate="never"))
    service.start()
    run_id = service.client.submit(graph_id, {"log": []}, thread_id="c1")
    assert service.redis.blpop([service.key("entered")], timeout=WAIT)  # `second` is running
    assert service.client.cancel(run_id).cancel_requested
    run = service.client.wait(run_id, timeout=WAIT)
    service.open_gate("never")  # free the worker thread
    assert run.status == runs.CANCELLED
    assert isinstance(run.exception(), TaskCancelledError)
    # The thread is free again: a new run on it starts and finishes.
    follow = service.client.submit(graph_id, {"log": []}, thread_id="c1")
    service.open_gate("never")
    assert service.client.wait(follow, timeout=WAIT).status == runs.SUCCESS


# --- interrupts -----------------------------------------------------------------------------


def test_an_interrupted_run_ends_interrupted(service: Service) -> None:
    graph_id = service.register(ask_graph())
    service.start()
    run = service.client.wait(service.client.submit(graph_id, {"log": []}, thread_id="q"))
    assert run.status == runs.INTERRUPTED
    (pending,) = run.output["__interrupt__"]
    assert pending.value == "what is the answer?"


def test_interrupt_then_resume_with_a_command(service: Service) -> None:
    graph = ask_graph()
    graph_id = service.register(graph)
    service.start()
    run = service.client.wait(service.client.submit(graph_id, {"log": []}, thread_id="q"))
    assert run.status == runs.INTERRUPTED
    (pending,) = run.output["__interrupt__"]
    assert pending.value == "what is the answer?"
    resumed = service.client.submit(graph_id, Command(resume="42"), thread_id="q")
    final = service.client.wait(resumed, timeout=WAIT)
    assert final.status == runs.SUCCESS
    assert final.output == {"log": ["ask"], "answer": "42"}


# --- a coordinator lost mid-run -------------------------------------------------------------


class Killable:
    """An executor that stops dead on ``kill()``: no more steps, no more results delivered.

    What a coordinator process killed with SIGKILL leaves behind, in this process: tasks
    already sent go on running on the workers, but nothing here sees their results.
    """

    def __init__(self, inner: CeleryExecutor) -> None:
        self.inner = inner
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    def submit(
        self,
        spec: Any,
        step: StepInput,
        live: StepLive,
        tasks: Any,
        deliver: Callable[[TaskResult], None],
    ) -> Any:
        if self.killed:
            raise SystemExit("this coordinator was killed")  # ends the orphaned loop thread

        def gated(result: TaskResult) -> None:
            if not self.killed:
                deliver(result)

        return self.inner.submit(spec, step, live, tasks, gated)


class FanState(TypedDict, total=False):
    """Items fanned out to ``work``; ``done`` gathers their results."""

    items: list[int]
    done: Annotated[list[int], operator.add]
    total: int


def fan_graph(svc: Service) -> Any:
    """``start`` → one ``work`` task per item (waiting on gate ``work-gate``) → ``total``.

    Every node counts its executions in Redis (``work`` in counter ``work``: the gate is
    another key, since a task counting while the gate's list still holds another's token
    would meet the wrong type); ``work`` reports on list ``entered`` when it starts and on
    ``left`` when it is done.
    """
    r = svc.redis
    wait = svc.gate("work-gate")

    def start(state: FanState) -> dict[str, Any]:
        r.incr(svc.key("start"))
        return {}

    def work(item: int) -> dict[str, Any]:
        r.rpush(svc.key("entered"), item)
        wait()
        r.incr(svc.key("work"))
        r.rpush(svc.key("left"), item)
        return {"done": [item * 10]}

    def total(state: FanState) -> dict[str, Any]:
        r.incr(svc.key("total"))
        return {"total": sum(state["done"])}

    builder: StateGraph[FanState] = StateGraph(FanState)
    builder.add_node("start", start)
    builder.add_node("work", work)
    builder.add_node("total", total)
    builder.add_edge(START, "start")
    builder.add_conditional_edges(
        "start", lambda s: [Send("work", i) for i in s["items"]], ["work"]
    )
    builder.add_edge("work", "total")
    builder.add_edge("total", END)
    return builder.compile()


def test_a_second_coordinator_takes_over_a_lost_run(service: Service) -> None:
    graph = fan_graph(service)
    graph_id = service.register(graph)
    killable: list[Killable] = []

    def executor_factory(gid: str, g: Any) -> Executor:
        executor = Killable(CeleryExecutor(service.settings, gid, g, app=service.cluster.app))
        killable.append(executor)
        return executor

    first = service.start(executor_factory=executor_factory, stale_after=1.0)
    items = [1, 2, 3]
    run_id = service.client.submit(graph_id, {"items": items}, thread_id="lost")
    for _ in items:  # every `work` task is running on a worker
        assert service.redis.blpop([service.key("entered")], timeout=WAIT) is not None

    first.stop(abandon=True)  # the coordinator dies mid-step ...
    (executor,) = killable
    executor.kill()
    service.open_gate("work-gate", len(items))  # ... while its tasks finish on the workers
    for _ in items:
        assert service.redis.blpop([service.key("left")], timeout=WAIT) is not None
    assert service.client.get(run_id).status == runs.RUNNING  # still claimed by the dead one

    second = service.start(stale_after=1.0)
    run = service.client.wait(run_id, timeout=WAIT)
    assert run.status == runs.SUCCESS, run.error
    assert run.owner == second.owner and run.attempts == 2
    assert run.output == {"items": items, "done": [10, 20, 30], "total": 60}
    # Tasks finished before the takeover were not run again.
    assert [service.count(n) for n in ("start", "work", "total")] == [1, len(items), 1]
    executor.inner.close()  # the dead coordinator's loop thread holds it forever


# --- the command line -----------------------------------------------------------------------


@pytest.fixture
def cli_env(service: Service, monkeypatch: pytest.MonkeyPatch) -> Service:
    """``bulksync …`` commands in this process talk to this test's services."""
    monkeypatch.setenv("BULKSYNC_DATABASE_URL", service.settings.database_url)
    monkeypatch.setenv("BULKSYNC_REDIS_URL", service.settings.redis_url)
    monkeypatch.setenv("BULKSYNC_BROKER_URL", service.settings.broker_url)
    monkeypatch.setenv("BULKSYNC_QUEUE", service.settings.queue)
    return service


def test_cli_submit_wait_shows_progress_then_the_output(
    cli_env: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = build_demo_graph().compile()
    graph_id = cli_env.register(graph)
    cli_env.start()
    text = json.dumps(demo_input(3, ["cats", "coffee"]))
    assert main(["submit", graph_id, "--input", text, "--thread", "cli", "--wait"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == graph.invoke(demo_input(3, ["cats", "coffee"]))
    # Not a terminal: plain lines, at most one a second (test_cli_people.py: on a terminal).
    header, *lines = err.splitlines()
    assert header.startswith("run ") and "thread cli" in header and "\r" not in err
    # The first line: still queued, or running (its first step reported, or not yet).
    first = lines[0].split(" · ", 1)[1]
    assert (
        first.startswith("queued, waiting for a coordinator serving")
        or first == "running"
        or "step" in first
    )
    assert lines[-1].endswith("· success")

    assert main(["runs", "--thread", "cli"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["RUN", "STATUS", "KIND"]
    assert table[1].split()[1:5] == ["success", "invoke", graph_id, "cli"]

    assert main(["state", "cli", "--graph", graph_id]) == 0
    state = json.loads(capsys.readouterr().out)
    assert (state["values"], state["next"]) == (json.loads(out), [])
    assert main(["history", "cli", "--graph", graph_id, "--limit", "2", "--json"]) == 0
    found = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["step"], x["next"]) for x in found] == [(3, []), (2, ["summarize"])]


def test_cli_submit_without_wait_prints_the_run_id(
    cli_env: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    graph_id = cli_env.register(ask_graph())
    argv = ["resume", "q", "--graph", graph_id, "--value", '"42"', "--queue-anyway"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    run_id = out.strip()
    assert f"bulksync follow {run_id}" in err
    run = cli_env.client.get(run_id)
    assert (run.thread_id, run.payload["input"]) == ("q", Command(resume="42"))
    assert main(["cancel", run_id]) == 0
    assert capsys.readouterr().out.strip() == f"{run_id}: cancelled"


def test_cli_failed_run_exits_1_with_its_error(
    cli_env: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    graph_id = cli_env.register(chain_graph(cli_env, fail=True))
    cli_env.start()
    assert main(["submit", graph_id, "--input", "{}", "--wait"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "ended with status error: KeyError: 'second failed on purpose'" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cancel", "nope"], "no run 'nope' in this database"),
        (["state", "t", "--graph", "g:nothere"], "no coordinator serves graph 'g:nothere'"),
        (["submit", "g:graph", "--input", "{}"], "--queue-anyway"),
        (
            [
                "submit",
                "g:graph",
                "--input",
                "{}",
                "--thread",
                "busy",
                "--multitask-strategy",
                "reject",
                "--queue-anyway",
            ],
            "thread 'busy' is busy with run",
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_cli_errors_are_one_line(
    cli_env: Service, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    # Never runs: no coordinator serves g:graph.
    cli_env.client.submit("g:graph", {}, thread_id="busy", require_coordinator=False)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err, err


def test_cli_unreachable_redis_is_one_line(
    cli_env: Service, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BULKSYNC_REDIS_URL", "redis://127.0.0.1:1/0")
    assert main(["submit", "g:graph", "--input", "{}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in err and "BULKSYNC_REDIS_URL" in err


def test_a_waiting_coordinator_takes_one_wake_up_per_free_slot(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wake-ups pile up while a coordinator is full (a burst of submissions, runs ending);
    # one claim serves as many as it has slots, instead of one claim each.
    coordinator = service.coordinator(max_runs=3)
    service.redis.delete(keys.WAKE)
    service.redis.lpush(keys.WAKE, *[b"1"] * 5)
    coordinator._pop_wakes(3)
    assert service.redis.llen(keys.WAKE) == 2  # the rest are for other coordinators

    def before_redis_7(*args: Any, **kwargs: Any) -> None:
        raise redis.ResponseError("unknown command 'BLMPOP', with args beginning with: '1'")

    monkeypatch.setattr(coordinator.redis, "blmpop", before_redis_7)
    coordinator._pop_wakes(3)
    assert service.redis.llen(keys.WAKE) == 1  # one at a time there
    coordinator._pop_wakes(3)
    assert service.redis.llen(keys.WAKE) == 0
