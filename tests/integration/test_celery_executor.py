"""The attached Celery executor and its workers, on the session's in-process Celery worker.

Covers issue 3 items 1-3: Send fan-out through the cluster, the claim check (messages stay
small whatever the state or fan-out), per-node task names and queues, node timeouts,
cancellation, unknown graphs, duplicate deliveries, custom stream events and errors crossing
the wire. What a worker *process* does (``bulksync worker``, kill -9) lives in
``test_worker_process.py`` and ``test_worker_faults.py``.

Messages are inspected with Celery's ``before_task_publish`` signal, which sees every
message the coordinator publishes (body, headers, routing key) just before kombu sends it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import operator
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import pytest
import redis
from celery.signals import before_task_publish, task_postrun, task_prerun
from kombu.serialization import dumps as kombu_dumps

from bulksync import keys
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.collector import WIDE
from bulksync.config import get_stream_writer
from bulksync.errors import (
    NodeTimeoutError,
    SerializationError,
    TaskCancelledError,
    TaskTimeoutError,
    UnknownGraphError,
)
from bulksync.graph import END, START, StateGraph
from bulksync.service.cancel import cancel_run
from bulksync.types import Send, TimeoutPolicy
from bulksync.workers import wire
from tests.integration.test_operators import wait_until

pytestmark = pytest.mark.integration

RELEASE_WAIT = 30.0
"""Longest a node blocks waiting for the test to release it (never reached when all is well)."""

MESSAGE_LIMIT = 4096
"""Bytes a Celery message (body plus headers) may take, whatever the state or the fan-out."""


class Log(TypedDict, total=False):
    log: Annotated[list[Any], operator.add]
    blob: str
    note: str


# -- recording what the coordinator publishes ------------------------------------------


@dataclass
class Message:
    """One published Celery message, as ``before_task_publish`` saw it."""

    name: str
    id: str
    routing_key: str
    headers: dict[str, Any]
    args: list[Any]
    size: int


@dataclass
class Published:
    """The messages published for task names starting with ``prefix`` (a graph id)."""

    redis: redis.Redis
    prefix: str = ""
    messages: list[Message] = field(default_factory=list)
    descriptors: list[list[Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(
        self,
        sender: str | None = None,
        body: Any = None,
        routing_key: str | None = None,
        headers: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        if not sender or not self.prefix or not sender.startswith(self.prefix):
            return
        headers = dict(headers or {})
        # The bytes kombu sends: the msgpack body plus the headers riding with it.
        size = len(kombu_dumps(body, serializer="msgpack")[2])
        size += len(kombu_dumps(headers, serializer="msgpack")[2])
        message = Message(sender, headers["id"], routing_key or "", headers, list(body[0]), size)
        descs = self.read_descriptors(message.args)
        with self.lock:
            self.messages.append(message)
            self.descriptors.append(descs)

    def read_descriptors(self, args: list[Any]) -> list[Any]:
        """A message's task descriptors: carried, or (a claim check) named in the step hash."""
        step_key, descs = args[2], args[5]
        if not isinstance(descs, str):
            return list(descs)
        data = self.redis.hget(keys.step(step_key), descs)
        assert data is not None, f"message names step field {descs!r}, which is not stored"
        return list(wire.SERDE.loads(data))

    def tasks(self, node: str = "") -> list[str]:
        """The bulksync task ids the messages (of ``node``) carry, in publishing order."""
        return [
            desc[0]
            for m, descs in zip(self.messages, self.descriptors, strict=True)
            for desc in descs
            if not node or m.name.endswith(f".{node}")
        ]


@pytest.fixture
def published(redis_client: redis.Redis) -> Iterator[Published]:
    recorder = Published(redis_client)
    before_task_publish.connect(recorder, weak=False)
    try:
        yield recorder
    finally:
        before_task_publish.disconnect(recorder)


def attach(cluster: Any, graph: Any, published: Published | None = None, **kw: Any) -> Any:
    """``graph`` on the cluster under a fresh id, its messages recorded by ``published``."""
    graph_id = cluster.register(graph)
    if published is not None:
        published.prefix = f"{graph_id}."
    return cluster.attach(graph, graph_id, **kw)


def background(fn: Any) -> tuple[threading.Thread, queue.Queue[Any]]:
    """Run ``fn`` on a thread; its return value or exception lands in the returned queue."""
    out: queue.Queue[Any] = queue.Queue()

    def body() -> None:
        try:
            out.put(fn())
        except BaseException as exc:
            out.put(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


# -- fan-out ---------------------------------------------------------------------------


def squares_graph(n: int, payload: int = 0, checkpointer: Any = None) -> Any:
    """START fans out ``n`` Sends to ``square``; each appends ``i*i`` (Send ``i`` carries
    ``payload`` bytes, which must travel in the step hash, never in a message)."""

    def route(state: Log) -> list[Send]:
        return [Send("square", {"i": i, "pad": "p" * payload}) for i in range(n)]

    b = StateGraph(Log)
    b.add_node("square", lambda a: {"log": [a["i"] * a["i"]]})
    b.add_node("total", lambda s: {"note": f"{len(s['log'])} squares"})
    b.add_conditional_edges(START, route, ["square"])
    b.add_edge("square", "total")
    b.add_edge("total", END)
    return b.compile(checkpointer=checkpointer)


def test_thousand_way_send_fan_out_in_task_path_order(cluster: Any, published: Published) -> None:
    graph = squares_graph(1000)
    out = attach(cluster, graph, published).invoke({"log": []})
    assert out["log"] == [i * i for i in range(1000)]  # Send order, whatever the arrival order
    assert out == graph.invoke({"log": []})
    # Pipelined and batched: far fewer messages than tasks, every task in exactly one.
    tasks = published.tasks()
    square_msgs = [m for m in published.messages if m.name.endswith(".square")]
    assert len(square_msgs) < 1000
    assert len(published.tasks("square")) == 1000
    assert len(tasks) == len(set(tasks)) == 1 + 1000 + 1  # __start__, the squares, total


def test_a_wide_steps_tasks_are_packed_with_the_garbage_collector_paused(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their inputs all live on until published: no collection need look at them
    (``bulksync.collector``)."""
    seen: list[bool] = []
    pack = wire.dumps_input

    def spy(value: Any, task: Any) -> bytes:
        if task.name == "square":
            seen.append(gc.isenabled())
        return pack(value, task)

    monkeypatch.setattr(wire, "dumps_input", spy)
    for n, paused in ((WIDE, True), (3, False)):
        seen.clear()
        out = attach(cluster, squares_graph(n)).invoke({"log": []})
        assert out["log"] == [i * i for i in range(n)]
        assert seen == [not paused] * n
    assert gc.isenabled()


def test_start_maps_the_input_here_unless_a_branch_of_the_users_leaves_it(
    cluster: Any, published: Published
) -> None:
    b = StateGraph(Log)
    b.add_node("first", lambda s: {"log": ["first"]})
    b.add_node("second", lambda s: {"log": ["second"]})
    b.add_edge(START, "first")
    b.add_edge("first", "second")
    graph = b.compile()
    out = attach(cluster, graph, published).invoke({"log": ["in"]})
    assert out == graph.invoke({"log": ["in"]}) == {"log": ["in", "first", "second"]}
    # No worker round trip for START's bookkeeping: one message per node that ran.
    assert [m.name.rpartition(".")[2] for m in published.messages] == ["first", "second"]


def test_claim_check_keeps_messages_small(
    cluster: Any, published: Published, redis_client: redis.Redis
) -> None:
    graph = squares_graph(500, payload=2000)
    blob = "x" * 5_000_000
    out = attach(cluster, graph, published).invoke({"log": [], "blob": blob})
    assert out["log"] == [i * i for i in range(500)]
    assert out["blob"] == blob
    assert out["note"] == "500 squares"
    assert len(published.tasks()) == 1 + 500 + 1
    sizes = [m.size for m in published.messages]
    assert max(sizes) < MESSAGE_LIMIT, f"largest message {max(sizes)} bytes"
    # Each step's claim check (5 MB here) is dropped once the step is over, and every report
    # was taken from the executor's inbox.
    step_keys = {m.args[2] for m in published.messages}
    assert len(step_keys) == 3
    for step_key in step_keys:
        assert wait_gone(redis_client, keys.step(step_key), keys.inbox(step_key))


def wait_gone(client: redis.Redis, *names: str) -> bool:
    """Whether the keys vanish (the gatherer drops them right after the step's last result)."""
    deadline = time.monotonic() + RELEASE_WAIT
    while client.exists(*names):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def result_keys(task_ids: list[str]) -> list[str]:
    """The keys a task's run leaves in Redis: its result and its delivery count."""
    return [k for t in task_ids for k in (keys.result(t), keys.deliveries(t))]


@pytest.mark.parametrize("saver", [None, InMemorySaver()], ids=["no saver", "saver"])
def test_a_committed_steps_results_leave_redis(
    cluster: Any, published: Published, redis_client: redis.Redis, saver: Any
) -> None:
    # No restart dispatches a step again once its checkpoint is committed (or, without a
    # saver, once it is applied): its results go then, not after result_ttl (a day).
    graph = attach(cluster, squares_graph(20, checkpointer=saver), published)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    assert graph.invoke({"log": []}, config)["note"] == "20 squares"
    tasks = published.tasks()
    assert len(tasks) == 1 + 20 + 1
    assert wait_gone(redis_client, *result_keys(tasks))


class Count(TypedDict):
    i: int


def test_each_step_starts_from_its_stored_checkpoint(
    cluster: Any, published: Published, redis_client: redis.Redis, pg_schema: str
) -> None:
    # A loop on its own thread plans its next step while Postgres commits the last one
    # (``pg_flight.py``): no task may start before that commit is confirmed, and a step's
    # results leave Redis only once its checkpoint is stored.
    with PostgresSaver.from_conn_string(pg_schema) as saver:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        events: list[tuple[str, int]] = []
        put_steps_soon = saver.put_steps_soon

        def sending(steps: Any) -> Any:
            configs, confirm = put_steps_soon(steps)
            step = steps[-1][3]["step"]

            def confirming() -> None:
                if confirm is not None:
                    confirm()
                events.append(("stored", step))

            return configs, confirming

        saver.put_steps_soon = sending  # type: ignore[method-assign]

        def tick(state: Count) -> Count:
            head = saver.get_tuple(config)
            events.append(("tick from", head.metadata["step"] if head is not None else -9))
            return {"i": state["i"] + 1}

        b = StateGraph(Count)
        b.add_node("tick", tick)
        b.add_edge(START, "tick")
        b.add_conditional_edges("tick", lambda s: "tick" if s["i"] < 5 else END, ["tick", END])
        graph = attach(cluster, b.compile(checkpointer=saver), published)
        assert graph.invoke({"i": 0}, config, durability="sync") == {"i": 5}
        # The tick of step k + 1 starts from the checkpoint of step k, confirmed before it
        # (the first from step 0's, sent with the input's checkpoint, step -1).
        expected = [e for k in range(5) for e in (("stored", k), ("tick from", k))]
        assert events == [*expected, ("stored", 5)]
        assert [c.metadata["step"] for c in saver.list(config)] == list(range(5, -2, -1))
        assert wait_gone(redis_client, *result_keys(published.tasks()))


def test_under_durability_exit_results_stay_for_a_restart(
    cluster: Any, published: Published, redis_client: redis.Redis
) -> None:
    # A durability="exit" run stores nothing before its end: a restart runs it from its start
    # and must find the results of the tasks that ran. (Their delivery counts go with each
    # step's end: every task of a step that ended has a result.)
    graph = attach(cluster, squares_graph(5, checkpointer=InMemorySaver()), published)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    assert graph.invoke({"log": []}, config, durability="exit")["note"] == "5 squares"
    kept = [keys.result(t) for t in published.tasks()]
    assert wait_gone(redis_client, *(keys.deliveries(t) for t in published.tasks()))
    published.messages.clear()
    published.descriptors.clear()
    # A run after it, whose results go: the gatherer has deleted what it was asked to.
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    assert graph.invoke({"log": []}, config)["note"] == "5 squares"
    client = redis_client
    assert wait_gone(client, *result_keys(published.tasks()))
    try:
        assert client.exists(*kept) == len(kept)
    finally:
        client.delete(*kept)


def test_messages_stay_small_for_a_very_wide_fan_out(cluster: Any, published: Published) -> None:
    # The widest batches (MAX_BATCH tasks a message) are reached from ~8,200 Sends on.
    graph = squares_graph(10_000)
    out = attach(cluster, graph, published).invoke({"log": []})
    assert out["log"] == [i * i for i in range(10_000)]
    sizes = [m.size for m in published.messages]
    assert max(sizes) < MESSAGE_LIMIT, f"largest message {max(sizes)} bytes"


# -- Flower: per-node task names, compact descriptions -----------------------------------


class Done(TypedDict):
    done: Annotated[list[int], operator.add]


def test_tasks_are_named_per_node_and_describe_ids_never_state(
    cluster: Any, published: Published
) -> None:
    inner = StateGraph(Log)
    inner.add_node("inner_step", lambda s: {"log": ["inner"]})
    inner.add_edge(START, "inner_step")
    b = StateGraph(Log)
    b.add_node("outer_step", lambda s: {"log": ["outer"]})
    b.add_node("sub", inner.compile())
    b.add_edge(START, "outer_step")
    b.add_edge("outer_step", "sub")
    graph = b.compile(checkpointer=InMemorySaver())
    secret = f"state-{uuid.uuid4().hex}"
    remote = attach(cluster, graph, published)
    config = {"configurable": {"thread_id": "flower-t"}, "run_id": "flower-run"}
    out = remote.invoke({"log": [], "note": secret}, config)
    assert out == graph.invoke({"log": [], "note": secret}, {"configurable": {"thread_id": "x"}})

    gid = published.prefix[:-1]
    # (START only maps the input here: the coordinator does that, no message for it.)
    assert [m.name for m in published.messages] == [f"{gid}.outer_step", f"{gid}.sub.inner_step"]
    for m, descs in zip(published.messages, published.descriptors, strict=True):
        node = m.name.rsplit(".", 1)[1]
        described = m.headers["argsrepr"]
        assert m.headers["task"] == m.name
        for part in ("run=flower-run", "thread=flower-t", "step=", f"node={node}", "task="):
            assert part in described, (part, described)
        assert descs[0][0] in described  # the task id
        assert secret not in described and secret not in repr(m.args)
        assert m.headers["kwargsrepr"] == "{}"
    assert cluster.app.conf.task_send_sent_event and cluster.app.conf.worker_send_task_events


def test_every_message_of_a_step_has_its_task_sent_event(
    cluster: Any, published: Published
) -> None:
    # Flower shows a task as sent from its task-sent event; a step's go out in one message.
    sent: dict[str, dict[str, Any]] = {}
    receiving = threading.Event()

    def capture() -> None:
        with cluster.app.connection() as conn:
            receiver = cluster.app.events.Receiver(
                conn, handlers={"task-sent": lambda e: sent.setdefault(e["uuid"], e)}
            )
            receiving.set()
            for _ in receiver.consume(limit=None, timeout=RELEASE_WAIT, wakeup=False):
                if len(sent) >= len(published.messages) > 1:
                    return

    b = StateGraph(Done)
    b.add_node("work", lambda item: {"done": [item["i"]]})
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(20)])
    fan = b.compile()
    published.prefix = f"{cluster.register(fan)}."
    four = dataclasses.replace(cluster.settings, target_messages=4)
    executor = cluster.executor(published.prefix[:-1], fan, four)
    listener = threading.Thread(target=capture, daemon=True)
    listener.start()
    assert receiving.wait(RELEASE_WAIT)
    time.sleep(0.5)  # the receiver's queue is bound once it consumes
    assert sorted(fan.with_executor(executor).invoke({"done": []})["done"]) == list(range(20))
    listener.join(RELEASE_WAIT)
    work = [m for m in published.messages if m.name.endswith(".work")]
    assert len(work) > 1
    for m in published.messages:
        event = sent[m.id]
        assert event["name"] == m.name and event["queue"] == cluster.settings.queue
        assert event["args"] == m.headers["argsrepr"]


def test_an_async_nodes_tasks_ride_more_to_a_message(cluster: Any, published: Published) -> None:
    # A worker runs a message's async tasks all at once: they need fewer messages.
    async def waits(item: dict[str, int]) -> dict[str, list[int]]:
        await asyncio.sleep(0.01)
        return {"done": [item["i"]]}

    def quick(item: dict[str, int]) -> dict[str, list[int]]:
        return {"done": [item["i"]]}

    settings = dataclasses.replace(
        cluster.settings, target_messages=1, max_batch=4, max_async_batch=16
    )
    for node, messages in ((waits, 1), (quick, 3)):
        b = StateGraph(Done)
        b.add_node("work", node)
        b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(12)])
        fan = b.compile()
        published.prefix = f"{cluster.register(fan)}."
        published.messages.clear()
        executor = cluster.executor(published.prefix[:-1], fan, settings)
        out = fan.with_executor(executor).invoke({"done": []})
        assert sorted(out["done"]) == list(range(12))
        assert len([m for m in published.messages if m.name.endswith(".work")]) == messages


# -- per-node queues -------------------------------------------------------------------


def test_node_with_a_queue_is_published_to_it_and_runs(cluster: Any, published: Published) -> None:
    special = f"{cluster.settings.queue}-special"
    consumed: dict[str, str] = {}

    def on_prerun(sender: Any = None, task_id: str = "", task: Any = None, **_: Any) -> None:
        info = getattr(task.request, "delivery_info", None) or {}
        consumed[task_id] = info.get("routing_key", "")

    b = StateGraph(Log)
    b.add_node("plain", lambda s: {"log": ["plain"]})
    b.add_node("gpu", lambda s: {"log": ["gpu"]}, queue=special)
    b.add_edge(START, "plain")
    b.add_edge("plain", "gpu")
    graph = b.compile()
    task_prerun.connect(on_prerun, weak=False)
    try:
        out = attach(cluster, graph, published).invoke({"log": []})
    finally:
        task_prerun.disconnect(on_prerun)
    assert out["log"] == ["plain", "gpu"]
    routes = {m.name.rsplit(".", 1)[1]: m for m in published.messages}
    assert routes["gpu"].routing_key == special
    assert routes["plain"].routing_key == cluster.settings.queue
    assert consumed[routes["gpu"].id] == special  # the worker took it from that queue


# -- timeouts --------------------------------------------------------------------------


def slow_graph(release: threading.Event) -> Any:
    def slow(state: Log) -> dict[str, Any]:
        release.wait(RELEASE_WAIT)
        return {"log": ["slow finished"]}

    b = StateGraph(Log)
    b.add_node("quick", lambda s: {"log": ["quick"]})
    b.add_node("slow", slow)
    b.add_edge(START, "quick")
    b.add_edge("quick", "slow")
    return b.compile(checkpointer=InMemorySaver())


def test_an_async_nodes_timeout_is_kept_by_its_worker(cluster: Any) -> None:
    """The worker stops the node's coroutine at its timeout (no coordinator deadline is
    involved: that is the executor's own limit, tested next) and the step stays pending."""

    async def slow(state: Log) -> dict[str, Any]:
        await asyncio.sleep(RELEASE_WAIT)
        return {"log": ["slow finished"]}

    b = StateGraph(Log)
    b.add_node("quick", lambda s: {"log": ["quick"]})
    b.add_node("slow", slow, timeout=TimeoutPolicy(idle_timeout=0.5))
    b.add_edge(START, "quick")
    b.add_edge("quick", "slow")
    graph = b.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"timeout-{uuid.uuid4().hex}"}}
    started = time.monotonic()
    with pytest.raises(NodeTimeoutError, match=r"Node 'slow'.*idle timeout of 0\.500s") as info:
        attach(cluster, graph).invoke({"log": []}, config)
    assert time.monotonic() - started < RELEASE_WAIT
    assert (info.value.kind, info.value.timeout) == ("idle", 0.5)
    assert graph.get_state(config).values["log"] == ["quick"]
    assert graph.get_state(config).next == ("slow",)


def test_the_executors_task_time_limit_stops_a_sync_node(cluster: Any) -> None:
    release = threading.Event()
    graph = slow_graph(release)
    config = {"configurable": {"thread_id": f"default-timeout-{uuid.uuid4().hex}"}}
    try:
        with pytest.raises(TaskTimeoutError, match=r"node 'slow'.*0\.5s task time limit") as info:
            attach(cluster, graph, default_timeout=0.5).invoke({"log": []}, config)
    finally:
        release.set()
    assert "BULKSYNC_TASK_TIMEOUT" in str(info.value)


# -- cancellation ----------------------------------------------------------------------


def test_cancel_run_stops_the_step_and_applies_no_later_writes(
    cluster: Any, redis_client: redis.Redis
) -> None:
    release = threading.Event()
    started: queue.Queue[str] = queue.Queue()
    finished: queue.Queue[str] = queue.Queue()

    def blocking(name: str) -> Any:
        def node(state: Log) -> dict[str, Any]:
            started.put(name)
            release.wait(RELEASE_WAIT)
            finished.put(name)
            return {"log": [f"{name} wrote after cancel"]}

        return node

    b = StateGraph(Log)
    b.add_node("first", lambda s: {"log": ["first"]})
    b.add_node("left", blocking("left"))
    b.add_node("right", blocking("right"))
    b.add_node("after", lambda s: {"log": ["after"]})
    b.add_edge(START, "first")
    b.add_edge("first", "left")
    b.add_edge("first", "right")
    b.add_edge(["left", "right"], "after")
    graph = b.compile(checkpointer=InMemorySaver())
    run_id = f"cancel-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": run_id}, "run_id": run_id}
    remote = attach(cluster, graph)
    thread, outcome = background(lambda: list(remote.stream({"log": []}, config)))
    try:
        assert {started.get(timeout=RELEASE_WAIT), started.get(timeout=RELEASE_WAIT)} == {
            "left",
            "right",
        }
        cancel_run(redis_client, run_id, cluster.settings)
        result = outcome.get(timeout=RELEASE_WAIT)
    finally:
        release.set()
    assert isinstance(result, TaskCancelledError), result
    # Both nodes finish their bodies after the run was cancelled; neither write is applied.
    assert {finished.get(timeout=RELEASE_WAIT), finished.get(timeout=RELEASE_WAIT)} == {
        "left",
        "right",
    }
    thread.join(RELEASE_WAIT)
    saved = graph.checkpointer.get_tuple(config)
    state = graph.get_state(config)
    assert state.values["log"] == ["first"]
    assert set(state.next) == {"left", "right"}
    assert not [w for w in saved.pending_writes if "after cancel" in repr(w)]


# -- graphs the worker did not load ------------------------------------------------------


def test_message_for_an_unloaded_graph_fails_the_run(cluster: Any) -> None:
    b = StateGraph(Log)
    b.add_node("hello", lambda s: {"log": ["hello"]})
    b.add_edge(START, "hello")
    graph = b.compile()
    loaded = cluster.register(graph)  # the worker serves this graph under another id
    unknown = f"tests.not_loaded_{uuid.uuid4().hex[:8]}:graph"
    executor = cluster.executor(unknown, graph)
    with pytest.raises(UnknownGraphError) as info:
        graph.with_executor(executor).invoke({"log": []})
    message = str(info.value)
    assert f"graph '{unknown}'" in message
    assert f"--graph {unknown}" in message
    assert loaded in message  # what the worker did load


# -- closing the executor ----------------------------------------------------------------


def named_executor(cluster: Any, graph: Any) -> tuple[Any, Callable[[], int]]:
    """An executor of ``graph`` whose Redis connections carry a name of their own, and how
    many of those Redis has open."""
    name = f"executor-{uuid.uuid4().hex[:8]}"
    url = f"{cluster.settings.redis_url}?client_name={name}"
    settings = dataclasses.replace(cluster.settings, redis_url=url)
    executor = cluster.executor(cluster.register(graph), graph, settings)

    def connections() -> int:
        with redis.Redis.from_url(cluster.settings.redis_url) as client:
            return sum(1 for c in client.client_list() if c.get("name") == name)

    return executor, connections


def test_closing_the_executor_closes_its_redis_connections(cluster: Any) -> None:
    b = StateGraph(Log)
    b.add_node("hello", lambda s: {"log": ["hello"]})
    b.add_edge(START, "hello")
    graph = b.compile()
    executor, connections = named_executor(cluster, graph)
    with executor:
        assert graph.with_executor(executor).invoke({"log": []}) == {"log": ["hello"]}
        assert connections() > 0
    assert connections() == 0


def test_a_step_in_flight_when_the_executor_closes_reconnects(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    def hold(state: Log) -> dict[str, Any]:
        release.wait(RELEASE_WAIT)
        return {"log": ["held"]}

    b = StateGraph(Log)
    b.add_node("hold", hold)
    b.add_edge(START, "hold")
    graph = b.compile()
    executor, connections = named_executor(cluster, graph)
    _, out = background(lambda: graph.with_executor(executor).invoke({"log": []}))
    wait_until(lambda: executor.gatherer.steps, "the step to be gathered")
    executor.close(wait=0.1)
    assert "closed while 1 of its steps were in flight: they reconnect" in caplog.text
    release.set()
    assert out.get(timeout=RELEASE_WAIT) == {"log": ["held"]}
    executor.close()
    assert connections() == 0


# -- duplicate delivery ----------------------------------------------------------------


def test_duplicate_delivery_runs_the_node_once_and_keeps_the_first_result(
    cluster: Any, published: Published, redis_client: redis.Redis
) -> None:
    r = redis_client
    counter = f"bulksync-test:runs:{uuid.uuid4().hex}"
    release = threading.Event()

    def counted(state: Log) -> dict[str, Any]:
        n = r.incr(counter)
        r.expire(counter, 600)
        return {"log": [f"counted run {n}"]}

    def holder(state: Log) -> dict[str, Any]:
        release.wait(RELEASE_WAIT)  # keeps the step open while the duplicates arrive
        return {"log": ["holder"]}

    b = StateGraph(Log)
    b.add_node("counted", counted)
    b.add_node("holder", holder)
    b.add_edge(START, "counted")
    b.add_edge(START, "holder")
    graph = b.compile(checkpointer=InMemorySaver())
    remote = attach(cluster, graph, published)
    config = {"configurable": {"thread_id": f"dup-{uuid.uuid4().hex}"}}
    chunks: queue.Queue[Any] = queue.Queue()

    def run() -> Any:
        for chunk in remote.stream({"log": []}, config, stream_mode="updates"):
            chunks.put(chunk)
        return "done"

    thread, outcome = background(run)
    republished = uuid.uuid4().hex
    redelivered = threading.Event()

    def on_postrun(sender: Any = None, task_id: str = "", **_: Any) -> None:
        if task_id == republished:
            redelivered.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        # Streamed on arrival, and persisted as a pending write while `holder` runs (within
        # the ledger's STORE_WITHIN).
        assert chunks.get(timeout=RELEASE_WAIT) == {"counted": {"log": ["counted run 1"]}}
        deadline = time.monotonic() + 5
        logged: list[Any] = []
        while not logged and time.monotonic() < deadline:
            pending = graph.checkpointer.get_tuple(config).pending_writes
            logged = [w[1:] for w in pending if w[1] == "log"]
            time.sleep(0.005)
        assert logged == [("log", ["counted run 1"])]
        (message,) = [m for m in published.messages if m.name.endswith(".counted")]
        # Delivered again by the broker (a re-published copy) and run again by a worker.
        cluster.app.send_task(
            message.name,
            args=message.args,
            task_id=republished,
            queue=cluster.settings.queue,
            headers={"bulksync": message.args[0]},
        )
        assert redelivered.wait(RELEASE_WAIT)
        assert cluster.runtime.run_message(*message.args) == 0
    finally:
        task_postrun.disconnect(on_postrun)
        release.set()
    assert outcome.get(timeout=RELEASE_WAIT) == "done"
    thread.join(RELEASE_WAIT)
    assert int(r.get(counter) or 0) == 1
    assert chunks.get_nowait() == {"holder": {"log": ["holder"]}}
    assert chunks.empty()


def test_first_recorded_result_wins(cluster: Any, redis_client: redis.Redis) -> None:
    from bulksync.coordinator.executor import TaskResult

    runtime = cluster.runtime
    r = redis_client
    step_key, task_id = uuid.uuid4().hex, str(uuid.uuid4())  # no answers: the slot is the id
    r.hset(keys.step(step_key), keys.STATE_FIELD, b"live")
    r.expire(keys.step(step_key), 600)
    first = wire.dumps_result(TaskResult(task_id, (("log", ["first"]),)), "node")
    second = wire.dumps_result(TaskResult(task_id, (("log", ["second"]),)), "node")
    try:
        assert runtime.record(step_key, task_id, first) is True
        assert runtime.record(step_key, task_id, second) is False
        inbox = r.lrange(keys.inbox(step_key), 0, -1)
        # Both deliveries report the kept (first) result, addressed to its step.
        reports = [wire.address_of(e) for e in inbox]
        assert [key for key, _ in reports] == [step_key] * 2
        assert [wire.loads_result(e[1:]).writes for _, e in reports] == [(("log", ["first"]),)] * 2
    finally:  # the result key expires by itself (RESULT_TTL)
        r.delete(keys.step(step_key), keys.inbox(step_key))


# -- custom stream events and errors -------------------------------------------------------


def test_custom_events_arrive_before_the_task_update(cluster: Any) -> None:
    def talker(state: Log) -> dict[str, Any]:
        write = get_stream_writer()
        for i in range(3):
            write({"progress": i})
        return {"log": ["talked"]}

    b = StateGraph(Log)
    b.add_node("talker", talker)
    b.add_node("quiet", lambda s: {"log": ["quiet"]})
    b.add_edge(START, "talker")
    b.add_edge("talker", "quiet")
    graph = b.compile()
    chunks = list(attach(cluster, graph).stream({"log": []}, stream_mode=["custom", "updates"]))
    assert chunks == [
        ("custom", {"progress": 0}),
        ("custom", {"progress": 1}),
        ("custom", {"progress": 2}),
        ("updates", {"talker": {"log": ["talked"]}}),
        ("updates", {"quiet": {"log": ["quiet"]}}),
    ]
    assert chunks == list(graph.stream({"log": []}, stream_mode=["custom", "updates"]))


class Opaque:
    """A value with no msgpack encoding."""


def test_node_error_keeps_its_type_and_message(cluster: Any) -> None:
    def picky(state: Log) -> dict[str, Any]:
        raise ValueError(f"picky refuses {len(state['log'])} entries")

    b = StateGraph(Log)
    b.add_node("picky", picky)
    b.add_edge(START, "picky")
    graph = b.compile()
    with pytest.raises(ValueError) as info:
        attach(cluster, graph).invoke({"log": [1, 2]})
    assert type(info.value) is ValueError
    assert str(info.value) == "picky refuses 2 entries"
    # The worker's traceback rides along as a note.
    assert any("Traceback" in note and "in picky" in note for note in info.value.__notes__)


def test_unserializable_write_names_the_node_and_channel(cluster: Any) -> None:
    b = StateGraph(Log)
    b.add_node("leaky", lambda s: {"note": Opaque()})
    b.add_edge(START, "leaky")
    graph = b.compile()
    with pytest.raises(SerializationError) as info:
        attach(cluster, graph).invoke({"log": []})
    message = str(info.value)
    assert "node 'leaky'" in message
    assert "channel 'note'" in message
    assert "Opaque" in message


def test_a_step_whose_redis_keys_vanish_is_dispatched_again(
    cluster: Any, redis_client: redis.Redis
) -> None:
    """Redis losing a step (a restart without persistence): the coordinator notices and
    dispatches the unfinished tasks again; a task that finished meanwhile is not rerun."""
    release = threading.Event()
    started: queue.Queue[int] = queue.Queue()
    runs: list[int] = []

    def work(arg: dict[str, int]) -> dict[str, Any]:
        runs.append(arg["i"])
        started.put(arg["i"])
        release.wait(RELEASE_WAIT)
        return {"log": [arg["i"]]}

    b = StateGraph(Log)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(3)])
    b.add_edge("work", END)
    graph = b.compile()
    remote = attach(cluster, graph)
    r = redis_client
    before = set(r.scan_iter(match=keys.step("*"), count=10_000))
    _, outcome = background(lambda: remote.invoke({"log": []}))
    try:
        assert {started.get(timeout=RELEASE_WAIT) for _ in range(3)} == {0, 1, 2}
        ours = set(r.scan_iter(match=keys.step("*"), count=10_000)) - before
        assert ours, "the step's hash should exist while its tasks run"
        for key in ours:  # what a Redis restart does to the step
            step_key = key.decode().rsplit(":", 1)[1]
            r.delete(key, keys.inbox(step_key))
    finally:
        release.set()
    result = outcome.get(timeout=RELEASE_WAIT)
    assert result == {"log": [0, 1, 2]}
    # The tasks finished (their results sit in their slots) before the step was dispatched
    # again, so none of them ran a second time.
    assert sorted(runs) == [0, 1, 2]
