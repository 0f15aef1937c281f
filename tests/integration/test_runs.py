"""``RunStore``: the runs table on Postgres — queueing per thread, claims, heartbeats, takeover."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, NamedTuple, TypedDict

import pytest

from bulksync.checkpoint.base import CheckpointTuple
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.constants import NULL_TASK_ID, START
from bulksync.errors import TaskCancelledError, ThreadBusyError, ThreadGraphError
from bulksync.graph import StateGraph
from bulksync.service import events, runs
from bulksync.service import runs_sql as sql
from bulksync.service.runs import Run, RunStore
from bulksync.types import Command, Interrupt
from bulksync.workers import wire

pytestmark = pytest.mark.integration

GRAPHS = ["g:graph"]


class State(TypedDict):
    n: int


@pytest.fixture
def store(pg_schema: str) -> Iterator[RunStore]:
    with RunStore.from_conn_string(pg_schema, max_size=8) as run_store:
        yield run_store


def submit(store: RunStore, thread: str, kind: str = "invoke", **kw: Any) -> str:
    payload = {"input": {"n": 1}, "config": {"configurable": {"thread_id": thread}}}
    return store.create(
        graph_id="g:graph", thread_id=thread, kind=kind, payload=payload, **kw
    ).run_id


def claim(store: RunStore, owner: str, limit: int, graphs: list[str] = GRAPHS) -> list[Run]:
    """The runs ``owner`` claims (without their threads' leases)."""
    return [c.run for c in store.claim(owner, limit, graphs)]


def run_on(saver: PostgresSaver, thread: str) -> CheckpointTuple:
    """Run a one-node graph on ``thread``; its head checkpoint after."""
    builder = StateGraph(State)
    builder.add_node("double", lambda s: {"n": s["n"] * 2})
    builder.add_edge(START, "double")
    config = {"configurable": {"thread_id": thread}}
    builder.compile(checkpointer=saver).invoke({"n": 1}, config)
    head = saver.get_tuple(config)
    assert head is not None
    return head


def age_heartbeat(store: RunStore, run_id: str) -> None:
    """Make a run look abandoned: its last heartbeat an hour ago."""
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE bulksync_runs SET heartbeat_at = now() - interval '1 hour' WHERE run_id = %s",
            (run_id,),
        )


def test_create_stores_the_payload_and_starts_pending(store: RunStore) -> None:
    payload = {"input": Command(resume={"a": (1, 2)}), "config": {"tags": ["x"]}}
    run = store.create(graph_id="g:graph", thread_id="t", kind="stream", payload=payload)
    assert run.status == runs.PENDING and run.owner is None and run.attempts == 0
    assert run.payload == payload
    assert store.get(run.run_id) == run
    assert store.get("no-such-run") is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kind": "explode"}, "unknown run kind 'explode'"),
        ({"multitask_strategy": "interrupt"}, "multitask_strategy='interrupt': use 'enqueue'"),
    ],
)
def test_create_refuses_unknown_kinds_and_strategies(
    store: RunStore, kw: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"graph_id": "g", "thread_id": "t", "kind": "invoke", "payload": {}}
    with pytest.raises(ValueError, match=message):
        store.create(**{**args, **kw})


def test_claim_takes_the_oldest_run_of_each_thread_only(store: RunStore) -> None:
    a1, b1, a2 = submit(store, "a"), submit(store, "b"), submit(store, "a")
    claimed = claim(store, "me", 10, GRAPHS)
    assert [r.run_id for r in claimed] == [a1, b1]
    assert all(r.status == runs.RUNNING and r.owner == "me" and r.attempts == 1 for r in claimed)
    assert claim(store, "me", 10, GRAPHS) == []  # a2 waits for a1
    assert store.finish(a1, "me", runs.SUCCESS, output=wire.SERDE.dumps({"n": 2}))
    assert [r.run_id for r in claim(store, "me", 10, GRAPHS)] == [a2]


def test_claim_respects_the_limit_oldest_first(store: RunStore) -> None:
    ids = [submit(store, f"t{i}") for i in range(5)]
    assert [r.run_id for r in claim(store, "me", 2, GRAPHS)] == ids[:2]
    assert [r.run_id for r in claim(store, "me", 0, GRAPHS)] == []
    assert [r.run_id for r in claim(store, "me", 10, GRAPHS)] == ids[2:]


def test_claim_takes_only_runs_of_the_graphs_given(store: RunStore) -> None:
    other = store.create(graph_id="other:graph", thread_id="t", kind="invoke", payload={})
    mine = submit(store, "u")
    assert [r.run_id for r in claim(store, "me", 10, GRAPHS)] == [mine]
    assert claim(store, "me", 10, []) == []
    assert [r.run_id for r in claim(store, "you", 10, ["other:graph"])] == [other.run_id]


def test_reads_neither_wait_for_nor_hold_up_writers(store: RunStore) -> None:
    writer = submit(store, "t")
    assert [r.run_id for r in claim(store, "me", 1, GRAPHS)] == [writer]
    read = submit(store, "t", kind="get_state", multitask_strategy="reject")
    later = submit(store, "t")
    assert [r.run_id for r in claim(store, "me", 10, GRAPHS)] == [read]
    store.finish(writer, "me", runs.SUCCESS)
    assert [r.run_id for r in claim(store, "me", 10, GRAPHS)] == [later]


def test_concurrent_claims_never_share_a_run(store: RunStore) -> None:
    ids = {submit(store, f"t{i}") for i in range(20)}
    got: dict[str, list[str]] = {}
    barrier = threading.Barrier(4)

    def take(owner: str) -> None:
        barrier.wait()
        claims = store.claim(owner, 20, GRAPHS, lease_ttl=30)
        assert all(c.started == (1, None, 0) for c in claims)  # each its thread's lease
        got[owner] = [c.run.run_id for c in claims]

    threads = [threading.Thread(target=take, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [run_id for owned in got.values() for run_id in owned]
    assert sorted(claimed) == sorted(ids)  # each run exactly once


def test_reject_names_the_thread_and_its_active_run(store: RunStore) -> None:
    first = submit(store, "busy")
    with pytest.raises(ThreadBusyError) as err:
        submit(store, "busy", multitask_strategy="reject")
    assert f"thread 'busy' is busy with run {first} (pending)" in str(err.value)
    assert "multitask_strategy='enqueue'" in str(err.value)
    claim(store, "me", 1, GRAPHS)
    with pytest.raises(ThreadBusyError, match=rf"{first} \(running\)"):
        submit(store, "busy", multitask_strategy="reject")
    store.finish(first, "me", runs.INTERRUPTED)
    assert [r.run_id for r in store.list(thread_id="busy")] == [first]  # refused: no row
    submit(store, "busy", multitask_strategy="reject")  # idle again: accepted


def test_a_thread_of_another_graph_is_refused_and_nothing_is_stored(store: RunStore) -> None:
    first = submit(store, "bound")
    payload = {"input": {"n": 1}, "config": {"configurable": {"thread_id": "bound"}}}
    with pytest.raises(ThreadGraphError, match="thread 'bound' belongs to graph 'g:graph'"):
        store.create(graph_id="g:other", thread_id="bound", kind="invoke", payload=payload)
    assert [r.run_id for r in store.list(thread_id="bound")] == [first]
    # The refused insert rolled back with its transaction: the connection serves the next.
    assert store.require(submit(store, "bound")).graph_id == "g:graph"


def test_a_thread_made_without_a_graph_takes_its_first_writers(store: RunStore) -> None:
    with store.pool.connection() as conn:  # as the threads API makes one
        conn.execute("INSERT INTO bulksync_threads (thread_id) VALUES ('new')")
    read = submit(store, "new", "get_state")  # a read binds nothing
    with store.pool.connection() as conn:
        bound = "SELECT graph_id FROM bulksync_threads WHERE thread_id = 'new'"
        assert conn.execute(bound).fetchone() == (None,)
        first = submit(store, "new")
        assert conn.execute(bound).fetchone() == ("g:graph",)
    with pytest.raises(ThreadBusyError, match=rf"busy with run {first} \(pending\)"):
        submit(store, "new", multitask_strategy="reject")
    payload = {"config": {"configurable": {"thread_id": "new"}}}
    with pytest.raises(ThreadGraphError, match="thread 'new' belongs to graph 'g:graph'"):
        store.create(graph_id="g:other", thread_id="new", kind="get_state", payload=payload)
    assert {r.run_id for r in store.list(thread_id="new")} == {read, first}


def test_heartbeat_reports_the_runs_still_owned(store: RunStore) -> None:
    mine, theirs = submit(store, "a"), submit(store, "b")
    claim(store, "me", 1, GRAPHS)
    claim(store, "them", 1, GRAPHS)
    assert store.heartbeat("me", [mine, theirs]) == {mine}
    assert store.heartbeat("me", []) == set()


def test_stale_runs_are_released_and_claimed_again(store: RunStore) -> None:
    lost, alive = submit(store, "a"), submit(store, "b")
    claim(store, "dead", 2, GRAPHS)
    age_heartbeat(store, lost)
    (released,) = store.take_over_stale(60)
    assert (released.run_id, released.status, released.owner) == (lost, runs.PENDING, None)
    assert store.require(alive).status == runs.RUNNING
    (again,) = claim(store, "heir", 10, GRAPHS)
    assert (again.run_id, again.owner, again.attempts) == (lost, "heir", 2)
    # The dead owner can no longer finish it (its result would be dropped).
    assert store.finish(lost, "dead", runs.SUCCESS) is None
    final = store.finish(lost, "heir", runs.SUCCESS)
    assert final is not None and final.run == store.require(lost)
    assert final.run.status == runs.SUCCESS


def test_a_stale_run_whose_cancel_was_asked_ends_cancelled(store: RunStore) -> None:
    run_id = submit(store, "a")
    claim(store, "dead", 1, GRAPHS)
    store.request_cancel(run_id)
    age_heartbeat(store, run_id)
    (changed,) = store.take_over_stale(60)
    assert changed.status == runs.CANCELLED
    assert isinstance(changed.exception(), TaskCancelledError)
    assert claim(store, "heir", 10, GRAPHS) == []


def test_start_takes_the_lease_keeps_the_first_head_and_tells_the_head_now(
    store: RunStore, pg_schema: str
) -> None:
    run_id = submit(store, "a")
    claim(store, "me", 1, GRAPHS)
    started = store.start(run_id, "me", "a", 30)
    assert started == (1, None, 0)  # the first token; no checkpoint yet
    with PostgresSaver.from_conn_string(pg_schema) as saver:
        saver.setup()
        head = run_on(saver, "a")
        # A Command's input writes on the head (as a run that applied its input leaves).
        saver.put_writes(head.config, [("n", 5), ("n", 6)], NULL_TASK_ID)
        saver.put_writes(head.config, [("n", 7)], "some-task")
        # The holder again: the same token, and the head now.
        assert store.start(run_id, "me", "a", 30) == (1, head.checkpoint.id, 2)
        run = store.require(run_id)
        assert (run.start_checkpoint, run.start_writes) == (None, 0)  # the first head stays
        # Another owner gets no lease while it is live, and records nothing.
        assert store.start(run_id, "someone-else", "a", 30) is None
        saver.release_lease("a", "me", 1)
        assert saver.acquire_lease("a", "someone-else", 30) == 2  # the store's lease, shared


def test_a_claim_with_a_lease_ttl_starts_its_writer_runs(store: RunStore, pg_schema: str) -> None:
    with PostgresSaver.from_conn_string(pg_schema) as saver:
        saver.setup()
        head = run_on(saver, "a")
        saver.put_writes(head.config, [("n", 5)], NULL_TASK_ID)
        assert saver.acquire_lease("b", "other", 30) == 1  # a coordinator that still holds it
        on_a, on_b, read = submit(store, "a"), submit(store, "b"), submit(store, "c", "get_state")
        claims = store.claim("me", 10, GRAPHS, lease_ttl=30)
        assert [(c.run.run_id, c.started) for c in claims] == [
            (on_a, (1, head.checkpoint.id, 1)),  # as start() would say
            (on_b, None),  # start() again later
            (read, None),  # a read needs no lease
        ]
        assert (claims[0].run.start_checkpoint, claims[0].run.start_writes) == (None, None)
        assert store.require(on_a).start_checkpoint == head.checkpoint.id
        assert store.require(on_b).start_writes is None
        assert store.start(on_a, "me", "a", 30) == (1, head.checkpoint.id, 1)
        # A later claim starts only the runs it claims, not those this owner claimed before.
        saver.release_lease("a", "me", 1)
        later = submit(store, "d")
        assert [(c.run.run_id, c.started) for c in store.claim("me", 10, GRAPHS, lease_ttl=30)] == [
            (later, (1, None, 0))
        ]
        assert saver.acquire_lease("a", "other", 30) == 2


def test_a_claim_finds_its_runs_again_without_reading_every_running_run(
    store: RunStore,
) -> None:
    # A coordinator driving a thousand runs: the statements after a claim's update look up
    # the runs it took (by owner and the transaction's time), as plain reads of them.
    with store.pool.connection() as conn:
        conn.execute(
            """INSERT INTO bulksync_runs (run_id, thread_id, graph_id, kind, payload, status,
                owner, heartbeat_at, updated_at)
            SELECT 'r' || i, 't' || i, 'g:graph', 'invoke', '', 'running', 'me', now(),
                now() - interval '1 minute' FROM generate_series(1, 1000) AS i"""
        )
        conn.execute("ANALYZE bulksync_runs")
    submit(store, "new")
    args = {"owner": "me", "limit": 10, "graphs": GRAPHS, "ttl": 30.0, "input": NULL_TASK_ID}
    with store.pool.connection() as conn, conn.transaction():
        assert len(conn.execute(sql.CLAIM_SQL, args).fetchall()) == 1
        for statement in (sql.LEASE_CLAIMED_SQL, sql.STARTED_CLAIMED_SQL):
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, args))
            assert "bulksync_runs_claimed" in plan, plan
            assert "bulksync_runs_running" not in plan, plan


def test_start_records_no_head_without_the_lease(store: RunStore, pg_schema: str) -> None:
    run_id = submit(store, "a")
    claim(store, "me", 1, GRAPHS)
    with PostgresSaver.from_conn_string(pg_schema) as saver:
        saver.setup()
        assert saver.acquire_lease("a", "other", 30) == 1  # a coordinator that still holds it
        assert store.start(run_id, "me", "a", 30) is None
        assert store.require(run_id).start_writes is None  # its head is taken once it leases
        saver.release_lease("a", "other", 1)
        assert store.start(run_id, "me", "a", 30) == (2, None, 0)
        assert store.require(run_id).start_writes == 0


def test_finish_needs_a_final_status(store: RunStore) -> None:
    run_id = submit(store, "a")
    claim(store, "me", 1, GRAPHS)
    with pytest.raises(ValueError, match="'running' is not a final status"):
        store.finish(run_id, "me", runs.RUNNING)


def test_finish_tells_whether_a_writer_run_waits_behind_on_its_thread(store: RunStore) -> None:
    first, behind, read = submit(store, "a"), submit(store, "a"), submit(store, "a", "get_state")
    lone = submit(store, "b")
    assert {r.run_id for r in claim(store, "me", 10)} == {first, read, lone}

    def queued(run_id: str) -> bool:
        finished = store.finish(run_id, "me", runs.SUCCESS)
        assert finished is not None and finished.run.status == runs.SUCCESS
        return finished.queued

    assert queued(read) is False  # a read holds up no writer
    assert queued(first) is True  # its end lets `behind` start: a coordinator is woken
    assert queued(lone) is False
    assert [r.run_id for r in claim(store, "me", 10)] == [behind]
    assert queued(behind) is False


def test_finished_runs_keep_output_and_error(store: RunStore) -> None:
    ok, bad = submit(store, "a"), submit(store, "b")
    claim(store, "me", 2, GRAPHS)
    pause = {"x": 1, "__interrupt__": [Interrupt("why?", "i1")]}
    store.finish(ok, "me", runs.INTERRUPTED, output=wire.SERDE.dumps(pause))
    failure = KeyError("boom")
    store.finish(bad, "me", runs.ERROR, output=wire.dumps_error(failure), error="KeyError: boom")
    assert store.require(ok).output == pause and store.require(ok).exception() is None
    run = store.require(bad)
    assert run.output is None and run.error == "KeyError: boom"
    error = run.exception()
    assert isinstance(error, KeyError) and error.args == ("boom",)


def test_request_cancel_by_status(store: RunStore) -> None:
    untouched, running, done = submit(store, "a"), submit(store, "b"), submit(store, "c")
    claim(store, "me", 10, GRAPHS)  # all three run now
    store.finish(done, "me", runs.SUCCESS)
    queued = submit(store, "b")  # waits behind `running`
    before, run = store.request_cancel(queued)
    assert (before, run.status, run.cancel_requested) == (runs.PENDING, runs.CANCELLED, True)
    before, run = store.request_cancel(running)
    assert (before, run.status, run.cancel_requested) == (runs.RUNNING, runs.RUNNING, True)
    before, run = store.request_cancel(done)
    assert (before, run.status, run.cancel_requested) == (runs.SUCCESS, runs.SUCCESS, False)
    assert store.require(untouched).status == runs.RUNNING
    with pytest.raises(LookupError, match="no run 'nope' in this database; check the id"):
        store.request_cancel("nope")
    with pytest.raises(LookupError, match="no run 'nope'"):
        store.require("nope")


def test_list_filters_newest_first(store: RunStore) -> None:
    a1, b1, a2 = submit(store, "a"), submit(store, "b"), submit(store, "a")
    claim(store, "me", 10, GRAPHS)
    assert [r.run_id for r in store.list()] == [a2, b1, a1]
    assert [r.run_id for r in store.list(thread_id="a")] == [a2, a1]
    assert [r.run_id for r in store.list(status=runs.PENDING)] == [a2]
    assert [r.run_id for r in store.list(limit=1)] == [a2]
    with pytest.raises(ValueError, match="unknown run status 'done'"):
        store.list(status="done")


def test_events_round_trip() -> None:
    fields = events.dumps_event(("sub:1",), "updates", {"n": (1, 2)})
    event = events.loads_event(b"1-0", fields)
    assert event == events.RunEvent("1-0", ("sub:1",), "updates", {"n": (1, 2)})


def test_an_end_event_carries_its_runs_final_row_unless_it_is_large(store: RunStore) -> None:
    small, large = submit(store, "a"), submit(store, "b")
    claim(store, "me", 2, GRAPHS)
    done = store.finish(small, "me", runs.SUCCESS, output=wire.SERDE.dumps({"n": 2}))
    assert done is not None
    end = events.loads_event(b"1-0", events.dumps_event((), events.END, events.end_event(done.run)))
    assert (end.chunk["status"], end.chunk["error"]) == (runs.SUCCESS, None)
    assert events.ended_run(end.chunk, small) == store.require(small)  # dates included
    assert events.ended_run(end.chunk, large) is None  # another run's
    big = wire.SERDE.dumps({"n": "x" * events.END_ROW_LIMIT})
    done = store.finish(large, "me", runs.SUCCESS, output=big)
    assert done is not None
    assert events.end_event(done.run) == {"status": runs.SUCCESS, "error": None}  # read it
    assert events.ended_run({"status": runs.SUCCESS, "error": None}, large) is None
    other_version = {"status": runs.SUCCESS, "run": {"run_id": large, "new_column": 1}}
    assert events.ended_run(other_version, large) is None


class _Pair(NamedTuple):
    left: int
    right: int


def test_events_keep_the_type_of_a_failed_tasks_error() -> None:
    chunk = {"id": "t", "error": KeyError("boom"), "input": _Pair(1, 2), "result": {}}
    for mode, sent in [("tasks", chunk), ("debug", {"type": "task_result", "payload": chunk})]:
        got = events.loads_event(b"1-0", events.dumps_event((), mode, sent)).chunk
        task = got if mode == "tasks" else got["payload"]
        assert type(task["error"]) is KeyError and task["error"].args == ("boom",)
        assert type(task["input"]) is _Pair  # a user's tuple type is left alone
    # other modes keep wire.SERDE's rule: an exception in a value is stored as StoredError
    values = events.loads_event(b"1-0", events.dumps_event((), "values", {"e": KeyError("x")}))
    assert type(values.chunk["e"]).__name__ == "StoredError"
