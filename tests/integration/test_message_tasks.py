"""The tasks of one Celery message on a real worker: async ones run at once on the worker
process's event loop (no thread waiting for each), slow sync ones that wait at once after the
first, quick ones and those that compute one by one; each with the graph's answer, a failing
one failing the run."""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypedDict

import pytest
import redis

from bulksync import keys
from bulksync.config import get_config
from bulksync.errors import TaskCancelledError
from bulksync.graph import START, StateGraph
from bulksync.service.cancel import cancel_run
from bulksync.settings import Settings
from bulksync.types import Send
from bulksync.workers import wire
from bulksync.workers.celery import claims, delivery, recorder
from bulksync.workers.celery.starts import StartCounter
from tests.integration.test_delivery import WAIT, background
from tests.integration.test_recorder import CountingRedis

pytestmark = pytest.mark.integration

TASKS = 12


class State(TypedDict):
    out: Annotated[list[int], operator.add]


class Peak:
    """How many tasks ran at the same time, at most; and on which event loops."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.loops: set[int] = set()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def _fanout(cluster: Any, work: Callable[..., Any], timeout: float | None = None) -> Any:
    """A graph sending TASKS tasks to ``work``, all in one message, on the test worker
    (``timeout``: their time limit)."""
    b = StateGraph(State)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(TASKS)])
    graph = b.compile()
    graph_id = cluster.register(graph)
    one_message = dataclasses.replace(cluster.settings, target_messages=1)
    executor = cluster.executor(graph_id, graph, one_message, default_timeout=timeout)
    return graph.with_executor(executor)


@pytest.fixture
def worker_settings(cluster: Any) -> Any:
    """Change the test worker's settings for one test (its runtime reads them per message)."""
    kept = cluster.runtime.settings

    def change(**changes: Any) -> None:
        cluster.runtime.settings = dataclasses.replace(kept, **changes)

    yield change
    cluster.runtime.settings = kept


def test_async_tasks_of_a_message_run_at_once_on_one_loop(
    cluster: Any, worker_settings: Any
) -> None:
    worker_settings(task_threads=2)  # no thread waits for an async task: more run at once
    peak = Peak()

    async def work(task: dict[str, Any]) -> dict[str, Any]:
        peak.enter()
        peak.loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.2)
        peak.leave()
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert peak.peak > 2
    assert len(peak.loops) == 1  # the worker process's loop, shared by the message's tasks


def test_a_cancelled_run_stops_every_running_async_task_of_a_message(
    cluster: Any, worker_settings: Any, redis_client: redis.Redis
) -> None:
    worker_settings(task_threads=2, cancel_poll=0.05)
    stopper = cluster.runtime.stopper()
    running: queue.Queue[int] = queue.Queue()
    cancelled: queue.Queue[int] = queue.Queue()
    watched: list[int] = []

    async def work(task: dict[str, Any]) -> dict[str, Any]:
        running.put(task["i"])
        watched.append(len(stopper._running))
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.put(task["i"])
            raise
        return {"out": [task["i"]]}

    run_id = f"cancel-{uuid.uuid4().hex}"
    graph = _fanout(cluster, work)
    outcome = background(lambda: graph.invoke({"out": []}, {"run_id": run_id}))
    assert sorted(running.get(timeout=WAIT) for _ in range(TASKS)) == list(range(TASKS))
    cancel_run(redis_client, run_id, cluster.settings)
    assert isinstance(outcome.get(timeout=WAIT), TaskCancelledError)
    assert sorted(cancelled.get(timeout=WAIT) for _ in range(TASKS)) == list(range(TASKS))
    # The message's tasks share one scope, which the stopper watches once for them all.
    assert watched == [1] * TASKS


def test_slow_sync_tasks_run_at_once_after_the_first(cluster: Any) -> None:
    peak = Peak()

    def work(task: dict[str, Any]) -> dict[str, Any]:
        peak.enter()
        time.sleep(0.05)  # far above --parallel-after
        peak.leave()
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert peak.peak > 1


def test_a_node_whose_tasks_waited_runs_the_next_messages_tasks_at_once(
    cluster: Any, worker_settings: Any
) -> None:
    peak, wait = Peak(), {"s": 0.2}  # far above --parallel-after

    def work(task: dict[str, Any]) -> dict[str, Any]:
        peak.enter()
        time.sleep(wait["s"])
        peak.leave()
        return {"out": [task["i"]]}

    def peak_of_a_run() -> int:
        peak.peak = 0
        assert graph.invoke({"out": []}) == {"out": list(range(TASKS))}
        return peak.peak

    graph = _fanout(cluster, work)
    assert 1 < peak_of_a_run() < TASKS  # the first alone, until it showed that it waits
    assert peak_of_a_run() == TASKS  # the worker learned: every task at once, the first too
    worker_settings(parallel_after=60.0)  # quick from now on, however busy the machine
    wait["s"] = 0.0
    peak_of_a_run()  # at once still; each task shows it no longer waits
    assert peak_of_a_run() == 1  # one by one again


def test_quick_sync_tasks_run_one_by_one(cluster: Any, worker_settings: Any) -> None:
    worker_settings(parallel_after=60.0)  # "quick", however busy the machine running the test
    peak = Peak()

    def work(task: dict[str, Any]) -> dict[str, Any]:
        peak.enter()
        peak.leave()
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert peak.peak == 1


class PipelineWatching(CountingRedis):
    """Counts round trips, and hands each pipeline's commands to ``sent`` as it is sent."""

    def sent(self, commands: list[Any]) -> None:
        """Look at the commands of a pipeline about to be sent."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        execute = pipe.execute

        def watched(raise_on_error: bool = True) -> Any:
            self.sent([args for args, _ in pipe.command_stack])
            return execute(raise_on_error)

        pipe.execute = watched
        return pipe


def script_keys(commands: list[Any], script: str) -> list[int]:
    """How many keys each ``EVAL`` of ``script`` among ``commands`` names."""
    return [int(a[2]) for a in commands if str(a[0]).upper() == "EVAL" and a[1] == script]


class StartsSeen(StartCounter):
    """Counts starts as usual, keeping the slots counted."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        super().__init__(client, settings)
        self.slots: list[str] = []

    def count(self, slots: Sequence[str]) -> None:
        self.slots += slots
        super().count(slots)


class RecordCounting(PipelineWatching):
    """Counts round trips, and the results each recording script carries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripts: list[int] = []

    def sent(self, commands: list[Any]) -> None:
        keys_ = script_keys(commands, recorder._RECORD_LUA)
        self.scripts += [n // 4 for n in keys_]  # four keys per result


def quick_fanout_recorded(
    cluster: Any, worker_settings: Any, redis_url: str, timeout: float | None = None
) -> tuple[RecordCounting, StartsSeen]:
    """Run TASKS quick tasks in one message on the test worker, counting its Redis use and
    the starts it counts."""
    # No claim heartbeat during the run: every round trip counted is the message's own.
    worker_settings(parallel_after=60.0, claim_heartbeat=60.0, claim_lease=600.0)
    runtime, pid = cluster.runtime, os.getpid()
    counting = RecordCounting.from_url(redis_url)
    kept = runtime._clients, runtime._claims, runtime._recorders, runtime._starts
    runtime._clients, runtime._claims, runtime._recorders = {pid: counting}, {}, {}
    starts = StartsSeen(counting, cluster.runtime.settings)
    runtime._starts = {pid: starts}
    try:

        def work(task: dict[str, Any]) -> dict[str, Any]:
            return {"out": [task["i"]]}

        graph = _fanout(cluster, work, timeout)
        assert graph.invoke({"out": []}) == {"out": list(range(TASKS))}
    finally:
        runtime._clients, runtime._claims, runtime._recorders, runtime._starts = kept
        starts.close()
        counting.close()
    return counting, starts


def test_quick_tasks_cost_no_round_trip_each(
    cluster: Any,
    worker_settings: Any,
    redis_url: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delivery, "QUICK_TASK", 60.0)  # quick, however busy the machine
    counting, starts = quick_fanout_recorded(cluster, worker_settings, redis_url)
    # The input's step: its task reserved with the step's read, its result. The fan-out:
    # its tasks read from the step hash, then all reserved with the step's read, their
    # results: no claim and no record per task.
    assert counting.trips == 2 + 3
    # The input's result, then the fan-out's in one script: the gatherer takes them at once.
    assert counting.scripts == [1, TASKS]
    # Each start after a message's first was counted, once, on the counter's own connection
    # (the first's by the read that claimed it).
    slots = starts.slots
    assert len(slots) == len(set(slots)) == TASKS - 1
    assert redis_client.mget([keys.deliveries(s) for s in slots]) == [b"1"] * (TASKS - 1)


def test_quick_results_held_back_are_recorded_a_few_at_a_time(
    cluster: Any, worker_settings: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delivery, "QUICK_TASK", 60.0)
    monkeypatch.setattr(delivery, "HELD_RESULTS", 5)
    counting, _ = quick_fanout_recorded(cluster, worker_settings, redis_url)
    assert counting.trips == 2 + 3 + 2  # two more writes of held results
    assert counting.scripts == [1, 5, 5, TASKS - 10]


def test_results_of_tasks_with_a_time_limit_are_not_held(
    cluster: Any, worker_settings: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator counts a task's time from its start to its result: none may wait.
    monkeypatch.setattr(delivery, "QUICK_TASK", 60.0)
    counting, starts = quick_fanout_recorded(cluster, worker_settings, redis_url, timeout=60.0)
    assert counting.scripts == [1] * (1 + TASKS)
    assert starts.slots == []  # each start counted by the claim that took it


class FailingRead(CountingRedis):
    """Fails, before sending it, the first pipeline that reads a step and claims a task."""

    failed = False

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        execute = pipe.execute

        def fail_once(raise_on_error: bool = True) -> Any:
            names = {str(args[0]).upper() for args, _ in pipe.command_stack}
            if not self.failed and "HMGET" in names and names & {"EVAL", "EVALSHA"}:
                self.failed = True
                pipe.reset()
                raise redis.ConnectionError("connection reset (injected)")
            return execute(raise_on_error)

        pipe.execute = fail_once
        return pipe


def test_a_task_claimed_with_the_step_read_still_runs_when_that_read_fails(
    cluster: Any, redis_url: str
) -> None:
    runtime, pid = cluster.runtime, os.getpid()
    failing = FailingRead.from_url(redis_url)
    kept = runtime._clients, runtime._claims, runtime._recorders
    runtime._clients, runtime._claims, runtime._recorders = {pid: failing}, {}, {}
    runs = []
    try:

        def work(state: State) -> dict[str, Any]:
            runs.append(1)
            return {"out": [1]}

        b = StateGraph(State)
        b.add_node("work", work)
        b.add_edge(START, "work")
        graph = cluster.attach(b.compile())
        assert graph.invoke({"out": []}) == {"out": [1]}
    finally:
        runtime._clients, runtime._claims, runtime._recorders = kept
        failing.close()
    assert failing.failed  # the read with the claim failed; the plain read and a claim ran
    assert runs == [1]


CLAIM_LUA = claims._CLAIM_LUA


class ClaimCounting(PipelineWatching):
    """Counts, for each round trip that claims tasks, how many it claims; keeps the delivery
    count keys of the tasks claimed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claimed: list[int] = []
        self.counts: list[str] = []

    def sent(self, commands: list[Any]) -> None:
        # The run's cancel flag, the step's hash, then three keys per task: claim, delivery
        # count, result.
        claiming = [
            a for a in commands if str(a[0]).upper() == "EVAL" and a[1] == claims._CLAIM_LUA
        ]
        slots = sum((int(a[2]) - 2) // 3 for a in claiming)
        if slots:
            self.claimed.append(slots)
        for a in claiming:
            self.counts += list(a[6 : 3 + int(a[2]) : 3])


@pytest.fixture
def fresh_runtime(cluster: Any, redis_url: str) -> Any:
    """The test worker's claims, recorder and task threads made anew, on a client counting
    claims, for one test (after ``worker_settings``)."""
    runtime, pid = cluster.runtime, os.getpid()
    counting = ClaimCounting.from_url(redis_url)
    kept = runtime._clients, runtime._claims, runtime._recorders, runtime._pools
    runtime._clients, runtime._claims = {pid: counting}, {}
    runtime._recorders, runtime._pools = {}, {}
    yield counting
    for pool in runtime._pools.values():
        pool.shutdown(wait=True)
    runtime._clients, runtime._claims, runtime._recorders, runtime._pools = kept
    counting.close()


def slow(task: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.05)  # far above --parallel-after, waiting
    return {"out": [task["i"]]}


def test_sync_tasks_are_reserved_with_the_step_read(
    cluster: Any, fresh_runtime: ClaimCounting
) -> None:
    assert _fanout(cluster, slow).invoke({"out": []}) == {"out": list(range(TASKS))}
    # The input's task with its step's read; the fan-out's tasks all with theirs, the
    # others to run at once once the first waited.
    assert fresh_runtime.claimed == [1, TASKS]


def test_with_a_time_limit_each_task_is_claimed_as_it_starts(
    cluster: Any, fresh_runtime: ClaimCounting
) -> None:
    # The coordinator's clock of a task starts with its claim: none may start early.
    graph = _fanout(cluster, slow, timeout=60.0)
    assert graph.invoke({"out": []}) == {"out": list(range(TASKS))}
    assert fresh_runtime.claimed == [1, 1] + [1] * (TASKS - 1)


def test_tasks_waiting_for_a_thread_keep_their_claims(
    cluster: Any, worker_settings: Any, fresh_runtime: ClaimCounting, redis_client: redis.Redis
) -> None:
    # Two threads for eleven tasks of 0.2 s: the last wait about a second, twice the lease.
    worker_settings(task_threads=2, claim_lease=0.5, claim_heartbeat=0.1)
    held: list[bool] = []

    def work(task: dict[str, Any]) -> dict[str, Any]:
        task_id = get_config()["configurable"]["checkpoint_ns"].rpartition(":")[2]
        held.append(redis_client.get(keys.claim(task_id)) is not None)
        time.sleep(0.2)
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert held == [True] * TASKS


def test_a_cancelled_runs_tasks_waiting_for_a_thread_never_start(
    cluster: Any, worker_settings: Any, fresh_runtime: ClaimCounting, redis_client: redis.Redis
) -> None:
    worker_settings(task_threads=2, cancel_poll=0.05)
    started: queue.Queue[int] = queue.Queue()
    ran: list[int] = []

    def work(task: dict[str, Any]) -> dict[str, Any]:
        started.put(task["i"])
        ran.append(task["i"])
        time.sleep(0.3)
        return {"out": [task["i"]]}

    run_id = f"cancel-{uuid.uuid4().hex}"
    graph = _fanout(cluster, work)
    outcome = background(lambda: graph.invoke({"out": []}, {"run_id": run_id}))
    for _ in range(3):  # the first, then the two threads' first
        started.get(timeout=WAIT)
    cancel_run(redis_client, run_id, cluster.settings)
    assert isinstance(outcome.get(timeout=WAIT), TaskCancelledError)
    stopper, deadline = cluster.runtime.stopper(), time.monotonic() + WAIT
    while stopper._running and time.monotonic() < deadline:  # until the message has ended
        time.sleep(0.05)
    assert 3 <= len(ran) < TASKS
    token = cluster.runtime.claims().token.encode()  # the queued tasks' claims were dropped
    claimed = redis_client.scan_iter(match=keys.claim("*"))
    assert [k for k in claimed if redis_client.get(k) == token] == []


def test_reserved_tasks_are_counted_only_as_they_start(
    cluster: Any, fresh_runtime: ClaimCounting, redis_client: redis.Redis
) -> None:
    # The fan-out's tasks are claimed with the step's read, the first counted as started,
    # the others reserved; as the second runs, the two alone are counted (a worker dying
    # there would count against them only).
    seen: list[list[Any]] = []

    def work(task: dict[str, Any]) -> dict[str, Any]:
        if task["i"] == 1:
            fanout = fresh_runtime.counts[1:]  # (after the input task's)
            deadline = time.monotonic() + WAIT
            while (counts := redis_client.mget(fanout)).count(b"1") < 2:  # (not awaited)
                assert time.monotonic() < deadline, "the second task's start was not counted"
                time.sleep(0.01)
            seen.append(counts)
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert fresh_runtime.claimed == [1, TASKS]
    (counts,) = seen
    assert counts == [b"1", b"1"] + [None] * (TASKS - 2)


def test_sync_tasks_that_compute_run_one_by_one(cluster: Any) -> None:
    # Far above --parallel-after, but computing: threads of one process would share its GIL.
    peak = Peak()

    def work(task: dict[str, Any]) -> dict[str, Any]:
        peak.enter()
        until = time.thread_time() + 0.02
        while time.thread_time() < until:
            pass
        peak.leave()
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert peak.peak == 1


def test_one_task_thread_runs_them_one_by_one(cluster: Any, worker_settings: Any) -> None:
    worker_settings(task_threads=1)
    peak = Peak()

    async def work(task: dict[str, Any]) -> dict[str, Any]:
        peak.enter()
        await asyncio.sleep(0.01)
        peak.leave()
        return {"out": [task["i"]]}

    assert _fanout(cluster, work).invoke({"out": []}) == {"out": list(range(TASKS))}
    assert peak.peak == 1


def test_a_failing_task_fails_the_run_with_its_error(cluster: Any) -> None:
    async def work(task: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        if task["i"] == 3:
            raise ValueError("task 3 broke")
        return {"out": [task["i"]]}

    with pytest.raises(ValueError, match="task 3 broke"):
        _fanout(cluster, work).invoke({"out": []})


def test_recording_a_result_drops_its_claim_in_the_same_script(
    settings: Any, redis_url: str
) -> None:
    from bulksync import keys
    from bulksync.workers.celery.node_task import WorkerRuntime
    from bulksync.workers.registry import GraphRegistry

    runtime = WorkerRuntime(GraphRegistry(), dataclasses.replace(settings, redis_url=redis_url))
    r, keeper = runtime.redis(), runtime.claims()
    slot, step_key = f"test-{uuid.uuid4().hex}", uuid.uuid4().hex
    r.hset(keys.step(step_key), "state", b"-")  # the step lives: the result is reported
    try:
        assert keeper.claim(slot, "run", step_key) == 1
        claim = keeper.hold(slot)
        assert r.get(keys.claim(slot)) == keeper.token.encode()
        assert runtime.record(step_key, slot, b"done", claim=claim)
        assert claim.released
        assert r.get(keys.claim(slot)) is None
        assert r.lrange(keys.inbox(step_key), 0, -1) == [wire.addressed(step_key, b"rdone")]
        r.set(keys.claim(slot), b"another worker")  # a later delivery claimed it
        keeper.unhold(claim)
        keeper.release(claim)
        assert r.get(keys.claim(slot)) == b"another worker"  # letting go left it
        assert r.get(keys.result(slot)) == b"done"
    finally:
        r.delete(keys.step(step_key), keys.inbox(step_key), keys.claim(slot), keys.result(slot))
        r.delete(keys.deliveries(slot))
        r.connection_pool.disconnect()


def test_every_thread_of_a_worker_process_can_call_redis_at_once(
    settings: Any, redis_url: str
) -> None:
    from bulksync.workers.celery.node_task import WorkerRuntime
    from bulksync.workers.registry import GraphRegistry

    threads = 150  # task threads, each waiting on Redis (more than a default pool holds)
    changed = dataclasses.replace(settings, redis_url=redis_url, task_threads=threads)
    r = WorkerRuntime(GraphRegistry(), changed).redis()
    key, errors = f"test-{uuid.uuid4().hex}", []
    start = threading.Barrier(threads)

    def wait() -> None:
        start.wait()
        try:
            r.blpop([key], timeout=0.3)  # holds its connection meanwhile
        except Exception as exc:
            errors.append(exc)

    waiting = [threading.Thread(target=wait) for _ in range(threads)]
    for t in waiting:
        t.start()
    for t in waiting:
        t.join()
    r.close()
    r.connection_pool.disconnect()  # the client's close leaves the pool's sockets open
    assert errors == []
