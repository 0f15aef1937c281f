"""Steps published at the same moment share a round trip, and their one-task messages of a
node share a message, on real Redis and a real worker; each run still gets its own answer,
its own failure and its own cancel."""

from __future__ import annotations

import operator
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
import redis

from bulksync.errors import TaskCancelledError, UnknownGraphError
from bulksync.graph import END, START, StateGraph
from bulksync.service.cancel import cancel_run
from bulksync.workers.celery.outbox import Outbox
from tests.integration.test_delivery import WAIT, background
from tests.integration.test_message_tasks import Peak

pytestmark = pytest.mark.integration


class Gated(Outbox):
    """An outbox that holds its first round trip until ``company`` more steps wait for the
    next: those then go together, as steps of busy runs do."""

    def __init__(self, base: Outbox, company: int) -> None:
        super().__init__(base._redis, base._direct, base._most)
        self.company = company
        self.batches: list[list[set[str]]] = []  # per round trip, the ids each step had joined
        self.runs: list[list[str]] = []  # per round trip, the run of each step
        self._held = False

    def _send(self, batch: list[Any]) -> None:
        if not self._held:
            self._held = True
            deadline = time.monotonic() + WAIT
            while self._rounds.waiting < self.company and time.monotonic() < deadline:
                time.sleep(0.005)
        super()._send(batch)
        self.batches.append([entry.joined for entry in batch])
        self.runs.append([entry.messages[0].args[3] for entry in batch if entry.messages])


class Item(TypedDict):
    i: int
    out: Annotated[list[int], operator.add]


def gated(cluster: Any, work: Callable[[Item], Any], company: int) -> tuple[Any, Gated]:
    """``START`` -> ``work`` -> ``END`` on the test worker, its outbox gated."""
    b = StateGraph(Item)
    b.add_node("work", work)
    b.add_edge(START, "work")
    b.add_edge("work", END)
    graph = b.compile()
    executor = cluster.executor(cluster.register(graph), graph)
    assert executor.outbox is not None, "the test's broker is its Redis: the direct path"
    executor.outbox = outbox = Gated(executor.outbox, company)
    return graph.with_executor(executor), outbox


def runs(graph: Any, count: int) -> list[Any]:
    """``count`` runs at once, the i-th on input ``i``; their outcomes, in order."""
    outcomes = [background(lambda i=i: graph.invoke({"i": i, "out": []})) for i in range(count)]
    return [o.get(timeout=WAIT) for o in outcomes]


def test_steps_published_together_share_a_message_and_keep_their_answers(cluster: Any) -> None:
    graph, outbox = gated(cluster, lambda s: {"out": [s["i"] * 10]}, company=3)
    assert runs(graph, 4) == [{"i": i, "out": [i * 10]} for i in range(4)]
    first, second = outbox.batches
    assert first == [set()]  # the first step went at once, alone
    # The three that waited went in one round trip, their tasks in one message.
    assert len(second) == 3 and all(len(joined) == 1 for joined in second)


def test_a_failing_task_of_a_shared_message_fails_its_own_run_only(cluster: Any) -> None:
    def work(s: Item) -> dict[str, Any]:
        if s["i"] == 2:
            raise ValueError("bad item 2")
        return {"out": [s["i"]]}

    graph, outbox = gated(cluster, work, company=2)
    first, second, failed = runs(graph, 3)
    assert first == {"i": 0, "out": [0]} and second == {"i": 1, "out": [1]}
    assert isinstance(failed, ValueError) and "bad item 2" in str(failed)
    assert [len(b) for b in outbox.batches] == [1, 2]


def test_slow_waiting_tasks_of_a_shared_message_run_at_once(cluster: Any) -> None:
    peak = Peak()

    def work(s: Item) -> dict[str, Any]:
        peak.enter()
        time.sleep(0.1)  # a model call: far above --parallel-after
        peak.leave()
        return {"out": [s["i"]]}

    graph, outbox = gated(cluster, work, company=4)
    assert runs(graph, 5) == [{"i": i, "out": [i]} for i in range(5)]
    assert [len(b) for b in outbox.batches] == [1, 4]
    assert peak.peak > 1


def test_cancelling_a_run_never_revokes_a_message_it_shares(
    cluster: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    revoked: list[Any] = []
    monkeypatch.setattr(cluster.app.control, "revoke", lambda ids, **kw: revoked.append(ids))
    started = threading.Semaphore(0)
    go = threading.Event()

    def work(s: Item) -> dict[str, Any]:
        started.release()
        assert go.wait(WAIT)
        return {"out": [s["i"]]}

    graph, outbox = gated(cluster, work, company=2)
    ids = [f"shared-{uuid.uuid4().hex}" for _ in range(3)]
    outcomes = [
        background(lambda i=i: graph.invoke({"i": i, "out": []}, {"run_id": ids[i]}))
        for i in range(3)
    ]
    for _ in range(3):
        assert started.acquire(timeout=WAIT)
    assert [len(b) for b in outbox.batches] == [1, 2]
    victim = ids.index(outbox.runs[1][0])  # one of the two runs that shared a message
    cancel_run(redis_client, ids[victim], cluster.settings)
    assert isinstance(outcomes[victim].get(timeout=WAIT), TaskCancelledError)
    go.set()
    for i in {0, 1, 2} - {victim}:
        assert outcomes[i].get(timeout=WAIT) == {"i": i, "out": [i]}
    # Its task rode with another run's: revoking its message would have stopped that one too.
    assert revoked == []


def test_a_shared_message_for_an_unloaded_graph_fails_each_of_its_runs(cluster: Any) -> None:
    b = StateGraph(Item)
    b.add_node("work", lambda s: {"out": [s["i"]]})
    b.add_edge(START, "work")
    graph = b.compile()
    loaded = cluster.register(graph)
    unknown = f"tests.not_loaded_{uuid.uuid4().hex[:8]}:graph"
    executor = cluster.executor(unknown, graph)
    assert executor.outbox is not None
    executor.outbox = outbox = Gated(executor.outbox, 2)
    outcomes = runs(graph.with_executor(executor), 3)
    assert [len(b) for b in outbox.batches] == [1, 2]
    for error in outcomes:
        assert isinstance(error, UnknownGraphError), error
        assert f"graph '{unknown}'" in str(error) and loaded in str(error)


def first_on_the_wire(outbox: Gated, key: str) -> Any:
    """A step that reads ``key``, sent alone and held on the wire (``Gated``); its outcome."""
    first = background(lambda: outbox.send(lambda pipe: pipe.get(key), []))
    deadline = time.monotonic() + WAIT
    while not outbox._rounds.busy and time.monotonic() < deadline:
        time.sleep(0.005)
    return first


def lease_lost() -> None:
    """A step's ``starting`` whose commit failed."""
    raise RuntimeError("lease lost")


def test_a_steps_error_fails_that_step_only(redis_client: redis.Redis, cluster: Any) -> None:
    key = f"bulksync-test-outbox-{uuid.uuid4().hex}"
    redis_client.set(key, "not a number", ex=60)
    _, outbox = gated(cluster, lambda s: {}, company=3)

    def broken(pipe: Any) -> None:
        pipe.get(key)
        raise ValueError("a bug in one step's commands")

    first = first_on_the_wire(outbox, key)
    bad_command = background(lambda: outbox.send(lambda pipe: pipe.incr(key), []))
    bad_step = background(lambda: outbox.send(broken, []))
    good = background(lambda: outbox.send(lambda pipe: pipe.get(key), []))
    assert first.get(timeout=WAIT) == ([b"not a number"], set())
    assert isinstance(bad_command.get(timeout=WAIT), redis.ResponseError)
    assert isinstance(bad_step.get(timeout=WAIT), ValueError)
    # It went in the same round trip as the failing ones, and has its answer all the same.
    assert good.get(timeout=WAIT) == ([b"not a number"], set())
    assert [len(b) for b in outbox.batches] == [1, 3]


def test_a_lone_steps_start_is_confirmed_once_its_round_trip_is_built(
    redis_client: redis.Redis, cluster: Any
) -> None:
    # The loop's checkpoint commit is confirmed as late as it can be (``StepLive.starting``):
    # after the step's commands are made, before any of them reaches Redis.
    key = f"bulksync-test-outbox-{uuid.uuid4().hex}"
    _, outbox = gated(cluster, lambda s: {}, company=0)
    order: list[str] = []

    def commands(pipe: Any) -> None:
        order.append("commands")
        pipe.set(key, "stored", ex=60)

    def starting() -> None:
        order.append(f"starting, {redis_client.get(key)!r} in Redis")

    assert outbox.send(commands, [], starting) == ([True], set())
    assert order == ["commands", "starting, None in Redis"]

    def refused() -> None:
        raise RuntimeError("the commit it starts from failed")

    other = f"{key}-other"
    with pytest.raises(RuntimeError, match="the commit it starts from failed"):
        outbox.send(lambda pipe: pipe.set(other, "x", ex=60), [], refused)
    assert redis_client.get(other) is None  # nothing of it was sent


def test_a_step_joining_others_confirms_its_start_before_it_joins(
    redis_client: redis.Redis, cluster: Any
) -> None:
    key = f"bulksync-test-outbox-{uuid.uuid4().hex}"
    _, outbox = gated(cluster, lambda s: {}, company=1)
    started: list[bool] = []
    first = first_on_the_wire(outbox, key)

    # While the first is on the wire: confirmed by the step's own thread, before it waits.
    bad = background(lambda: outbox.send(lambda pipe: pipe.set(key, "x"), [], lease_lost))
    assert isinstance(bad.get(timeout=WAIT), RuntimeError)
    assert outbox._rounds.waiting == 0  # it never joined
    ok = background(
        lambda: outbox.send(
            lambda pipe: pipe.get(key), [], lambda: started.append(outbox._rounds.busy)
        )
    )
    assert first.get(timeout=WAIT) == ([None], set())
    assert ok.get(timeout=WAIT) == ([None], set())
    assert started == [True]
    assert redis_client.get(key) is None
    assert [len(b) for b in outbox.batches] == [1, 1]


def test_steps_that_found_the_outbox_idle_but_went_together_confirm_first(
    redis_client: redis.Redis, cluster: Any
) -> None:
    # Two steps that each saw no round on the wire, and joined the same one all the same: the
    # thread sending it confirms each one's start before it builds the round trip.
    from bulksync.workers.celery.outbox import _Entry

    key = f"bulksync-test-outbox-{uuid.uuid4().hex}"
    _, outbox = gated(cluster, lambda s: {}, company=0)
    started: list[str] = []

    good = _Entry(lambda pipe: pipe.set(key, "good", ex=60), [], lambda: started.append("good"))
    bad = _Entry(lambda pipe: pipe.set(f"{key}-bad", "bad", ex=60), [], lease_lost)
    outbox._send([good, bad])
    assert started == ["good"]
    assert good.error is None and good.replies == [True]
    assert isinstance(bad.error, RuntimeError) and bad.replies == []
    assert redis_client.get(key) == b"good"
    assert redis_client.get(f"{key}-bad") is None
