"""What only PostgresSaver has: migrations, blob rows, query counts, leases and fencing.

The saver contract itself runs on Postgres in ``tests/unit/checkpoint/test_saver_contract.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from bulksync.checkpoint import pg_commits, pg_flight
from bulksync.checkpoint import postgres as postgres_module
from bulksync.checkpoint.base import Checkpoint
from bulksync.checkpoint.pg_migrations import FENCE_SQL, MIGRATIONS, apply_migrations
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.constants import ERROR
from bulksync.coordinator.clock import checkpoint_id
from bulksync.errors import LeaseLostError, SerializationError, ServiceUnavailableError

pytestmark = pytest.mark.integration

ALL_VERSIONS = list(range(1, len(MIGRATIONS) + 1))


@pytest.fixture
def saver(pg_schema: str) -> Iterator[PostgresSaver]:
    with PostgresSaver.from_conn_string(pg_schema, max_size=8) as pg_saver:
        pg_saver.setup()
        yield pg_saver


def query(saver: PostgresSaver, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with saver.pool.connection() as conn:
        rows: list[tuple[Any, ...]] = conn.execute(sql, params).fetchall()
    return rows


def versions(saver: PostgresSaver) -> list[int]:
    return [row[0] for row in query(saver, "SELECT version FROM bulksync_migrations ORDER BY 1")]


def thread(thread_id: str = "t1") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def checkpoint(step: int, values: dict[str, Any], versions: dict[str, int]) -> Checkpoint:
    return Checkpoint(4, checkpoint_id(step), "2024-01-01T00:00:00+00:00", values, versions, {})


def put_steps(saver: PostgresSaver, steps: int, thread_id: str = "t1") -> dict[str, Any]:
    """``steps`` checkpoints where ``a`` changes every step and ``b`` never; one write each."""
    config = thread(thread_id)
    for step in range(steps):
        ckpt = checkpoint(step, {"a": step, "b": "same"}, {"a": step + 1, "b": 1})
        new_versions = {"a": step + 1, "b": 1} if step == 0 else {"a": step + 1}
        config = saver.put(config, ckpt, {"step": step}, new_versions)
        saver.put_writes(config, [("a", step)], f"task-{step}")
    return config


def expire(saver: PostgresSaver, thread_id: str) -> None:
    query(
        saver,
        "UPDATE bulksync_thread_leases SET expires_at = now() - interval '1 second' "
        "WHERE thread_id = %s RETURNING 1",
        (thread_id,),
    )


def counts(saver: PostgresSaver) -> tuple[int, int]:
    """(checkpoint rows, blob rows)."""
    rows = query(
        saver,
        "SELECT (SELECT count(*) FROM bulksync_checkpoints),"
        " (SELECT count(*) FROM bulksync_checkpoint_blobs)",
    )
    return rows[0][0], rows[0][1]


# --- migrations -------------------------------------------------------------------------


def test_setup_is_idempotent(saver: PostgresSaver) -> None:
    saver.setup()
    saver.setup()
    assert versions(saver) == ALL_VERSIONS
    with saver.pool.connection() as conn:
        assert apply_migrations(conn) == []


def test_first_use_applies_migrations_by_itself(pg_schema: str) -> None:
    with PostgresSaver.from_conn_string(pg_schema) as pg_saver:
        put_steps(pg_saver, 2)
        assert versions(pg_saver) == ALL_VERSIONS
        assert len(list(pg_saver.list(thread()))) == 2
    assert pg_saver.pool.closed


def test_an_appended_migration_is_applied_alone(saver: PostgresSaver) -> None:
    extended = [*MIGRATIONS, "CREATE TABLE bulksync_extra (x int)"]
    with saver.pool.connection() as conn:
        assert apply_migrations(conn, extended) == [len(MIGRATIONS) + 1]
        assert apply_migrations(conn, extended) == []
    assert versions(saver) == [*ALL_VERSIONS, len(MIGRATIONS) + 1]


def test_a_failing_migration_applies_nothing(pg_schema: str) -> None:
    with psycopg.connect(pg_schema, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            apply_migrations(conn, [*MIGRATIONS, "SELECT * FROM no_such_table"])
        found = conn.execute(
            "SELECT to_regclass('bulksync_migrations'), to_regclass('bulksync_checkpoints')"
        ).fetchone()
    assert found == (None, None)


def test_concurrent_setup_applies_each_migration_once(pg_schema: str) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def setup() -> None:
        try:
            with PostgresSaver.from_conn_string(pg_schema, max_size=1) as pg_saver:
                barrier.wait()
                pg_saver.setup()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=setup) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    with psycopg.connect(pg_schema) as conn:
        rows = conn.execute("SELECT version FROM bulksync_migrations ORDER BY 1").fetchall()
    assert [row[0] for row in rows] == ALL_VERSIONS


# --- storage ----------------------------------------------------------------------------


def test_unchanged_channels_add_no_blob_rows(saver: PostgresSaver) -> None:
    put_steps(saver, 5)
    rows = query(saver, "SELECT channel, count(*) FROM bulksync_checkpoint_blobs GROUP BY channel")
    assert dict(rows) == {"a": 5, "b": 1}
    latest = saver.get_tuple(thread())
    assert latest is not None
    assert latest.checkpoint.channel_values == {"a": 4, "b": "same"}


def test_list_reads_pages_not_rows(pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    statements: list[str] = []

    class CountingCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append(str(query).lstrip())
            return super().execute(query, params, **kwargs)

    monkeypatch.setattr(postgres_module, "PAGE_SIZE", 10)
    pool: ConnectionPool[Any] = ConnectionPool(
        pg_schema, kwargs={"autocommit": True, "cursor_factory": CountingCursor}, open=True
    )
    with pool:
        pg_saver = PostgresSaver(pool)
        put_steps(pg_saver, 25)
        put_steps(pg_saver, 5, "t2")
        statements.clear()
        listed = list(pg_saver.list(None))
        assert len(listed) == 30
        assert all(len(t.pending_writes) == 1 for t in listed)
        assert all(t.checkpoint.channel_values["b"] == "same" for t in listed)
        # Three pages of 10 (checkpoints, blobs, writes each) and one empty page at most.
        assert len([s for s in statements if s.startswith(("SELECT", "WITH"))]) <= 3 * 3 + 1
        # A filter matched in SQL, and one matched in Python (a dict) that pages to the limit.
        assert len(list(pg_saver.list(None, filter={"step": 3, "x": None}))) == 2
        config = thread("t3")
        for step in range(12):
            ckpt = checkpoint(step, {}, {})
            config = pg_saver.put(config, ckpt, {"parents": {"": "root"}}, {})
        found = list(pg_saver.list(None, filter={"parents": {"": "root"}}, limit=11))
        assert [t.config["configurable"]["thread_id"] for t in found] == ["t3"] * 11


def test_duplicate_deliveries_record_one_result(saver: PostgresSaver) -> None:
    config = put_steps(saver, 1)
    barrier = threading.Barrier(6)

    def deliver(n: int) -> None:
        barrier.wait()
        saver.put_writes(config, [("x", n), ("y", n)], "dup-task")

    workers = [threading.Thread(target=deliver, args=(n,)) for n in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    found = saver.get_tuple(config)
    assert found is not None
    dup = [(ch, value) for task, ch, value in found.pending_writes if task == "dup-task"]
    assert len(dup) == 2
    assert dup[0][1] == dup[1][1]  # both slots from the one delivery that came first
    saver.put_writes(config, [(ERROR, "first")], "dup-task")
    saver.put_writes(config, [(ERROR, "second")], "dup-task")
    rows = query(
        saver,
        "SELECT idx, count(*) FROM bulksync_checkpoint_writes WHERE task_id = %s GROUP BY idx",
        ("dup-task",),
    )
    assert sorted(rows) == [(-1, 1), (0, 1), (1, 1)]


def test_a_batch_stores_each_tasks_writes_as_put_writes_would(saver: PostgresSaver) -> None:
    config = put_steps(saver, 1)
    saver.put_writes(config, [("x", "first")], "t-a")
    saver.put_writes(config, [(ERROR, "old")], "t-b")
    batch = [
        ([("x", "again"), ("y", 1)], "t-a", "p-a"),  # slot 0 kept; slot 1 new
        ([(ERROR, "new")], "t-b", "p-b"),  # a special slot takes the last value
        ([("x", 3)], "t-c", "p-c"),
    ]
    saver.put_writes_batch(config, batch)
    found = saver.get_tuple(config)
    assert found is not None
    got = sorted((t, ch, v) for t, ch, v in found.pending_writes if t.startswith("t-"))
    assert got == [
        ("t-a", "x", "first"),
        ("t-a", "y", 1),
        ("t-b", ERROR, "new"),
        ("t-c", "x", 3),
    ]


def test_a_slot_written_twice_in_one_batch_keeps_what_one_call_each_would(
    saver: PostgresSaver,
) -> None:
    config = put_steps(saver, 1)
    batch = [
        ([("x", "first"), (ERROR, "one")], "t-a", "p"),
        ([("x", "again"), (ERROR, "two")], "t-a", "p"),  # the same task's writes, again
    ]
    saver.put_writes_batch(config, batch)
    found = saver.get_tuple(config)
    assert found is not None
    got = sorted((t, ch, v) for t, ch, v in found.pending_writes if t == "t-a")
    assert got == [("t-a", ERROR, "two"), ("t-a", "x", "first")]


@pytest.mark.parametrize("per_statement", [2, pg_commits.ROWS_PER_STATEMENT])
def test_a_commit_of_many_rows_stores_them_all(
    saver: PostgresSaver, monkeypatch: pytest.MonkeyPatch, per_statement: int
) -> None:
    monkeypatch.setattr(pg_commits, "ROWS_PER_STATEMENT", per_statement)
    config = put_steps(saver, 1)
    # Special writes are never packed: a row each, more than a statement holds.
    batch = [([(ERROR, n)], f"t-{n:03}", "p") for n in range(300)]
    values = {f"c{n}": n for n in range(5)}
    ckpt = checkpoint(1, values, dict.fromkeys(values, 2))
    child = saver.put_step(config, batch, ckpt, {"step": 1}, dict.fromkeys(values, 2))
    parent = saver.get_tuple(config)
    assert parent is not None
    assert sorted(parent.pending_writes)[::299] == [("t-000", ERROR, 0), ("t-299", ERROR, 299)]
    assert len(parent.pending_writes) == 301  # and put_steps' own write
    head = saver.get_tuple(child)
    assert head is not None and head.checkpoint.channel_values == values


def test_a_batch_with_a_value_it_cannot_store_stores_none(saver: PostgresSaver) -> None:
    config = put_steps(saver, 1)
    batch = [([("x", 1)], "t-ok", ""), ([("x", threading.Lock())], "t-bad", "")]
    with pytest.raises(SerializationError):
        saver.put_writes_batch(config, batch)
    found = saver.get_tuple(config)
    assert found is not None
    assert [w for w in found.pending_writes if w[0].startswith("t-")] == []


def test_a_steps_last_writes_and_its_checkpoint_are_stored_together(
    saver: PostgresSaver,
) -> None:
    config = put_steps(saver, 1)
    batch = [([("a", "last")], "t-last", "p"), ([(ERROR, "boom")], "t-err", "q")]
    child = saver.put_step(config, batch, checkpoint(1, {"a": 1}, {"a": 2}), {"step": 1}, {"a": 2})
    stored = saver.get_tuple(config)
    assert stored is not None
    writes = sorted(w for w in stored.pending_writes if w[0].startswith("t-"))
    assert writes == [("t-err", ERROR, "boom"), ("t-last", "a", "last")]
    head = saver.get_tuple(thread())
    assert head is not None
    assert head.config == child
    assert head.parent_config == config
    assert head.checkpoint.channel_values == {"a": 1}


def stale_view(saver: PostgresSaver) -> tuple[PostgresSaver, dict[str, Any]]:
    """A view fenced with thread ``t1``'s first lease, after a checkpoint it stored, once
    another coordinator took the lease over; with that checkpoint's config."""
    stale = saver.fenced("t1", saver.acquire_lease("t1", "a", 30) or 0)
    config = stale.put(thread(), checkpoint(0, {"a": 0}, {"a": 1}), {}, {"a": 1})
    expire(saver, "t1")
    assert saver.acquire_lease("t1", "b", 30) == 2
    return stale, config


def test_a_step_a_stale_coordinator_commits_stores_neither_part(saver: PostgresSaver) -> None:
    stale, config = stale_view(saver)
    before = counts(saver)
    with pytest.raises(LeaseLostError, match="another coordinator took it over"):
        stale.put_step(
            config, [([("a", "x")], "t-x", "")], checkpoint(1, {"a": 1}, {"a": 2}), {}, {"a": 2}
        )
    assert counts(saver) == before


def test_a_commit_refused_at_its_fence_leaves_its_connection_usable(pg_schema: str) -> None:
    # One connection, so the refused commit's connection is the next commit's. A statement
    # prepared by psycopg on its sixth run, in a pipeline the fence aborted, was taken as
    # prepared though the server never saw it: the next run of it failed.
    with PostgresSaver.from_conn_string(pg_schema, max_size=1) as pg_saver:
        pg_saver.setup()
        stale = pg_saver.fenced("t1", pg_saver.acquire_lease("t1", "a", 30) or 0)
        config = stale.put(thread(), checkpoint(0, {"a": 0}, {"a": 1}), {}, {"a": 1})
        for step in range(1, 6):
            config = stale.put_step(*a_step(config, step))
        expire(pg_saver, "t1")
        current = pg_saver.fenced("t1", pg_saver.acquire_lease("t1", "b", 30) or 0)
        with pytest.raises(LeaseLostError, match="another coordinator took it over"):
            stale.put_step(*a_step(config, 6))
        for step in range(6, 9):
            config = current.put_step(*a_step(config, step))
        head = pg_saver.get_tuple(thread())
        assert head is not None and head.config == config
        assert head.checkpoint.channel_values == {"a": 8}


def test_more_statement_shapes_than_a_connection_keeps_prepared_all_commit(
    pg_schema: str,
) -> None:
    # Each step stores another number of channel values: a statement of its own shape, each
    # prepared on one connection. psycopg keeps 100 and deallocates the oldest, here in the
    # commits' pipelines; the first shapes come back after being deallocated.
    with PostgresSaver.from_conn_string(pg_schema, max_size=1) as pg_saver:
        pg_saver.setup()
        config = thread()
        for step, width in enumerate([*range(1, 131), *range(1, 11)]):
            values = {f"c{n}": step for n in range(width)}
            ckpt = checkpoint(step, values, dict.fromkeys(values, step + 1))
            config = pg_saver.put_step(
                config, [], ckpt, {"step": step}, dict.fromkeys(values, step + 1)
            )
        head = pg_saver.get_tuple(thread())
        assert head is not None and head.config == config
        assert head.checkpoint.channel_values == {f"c{n}": 139 for n in range(10)}


# --- commits sent now, confirmed later (pg_flight.py) ------------------------------------


def a_step(config: dict[str, Any], step: int) -> Any:
    """``put_step``'s arguments for checkpoint ``step`` after ``config``, with one write."""
    ckpt = checkpoint(step, {"a": step}, {"a": step + 1})
    return (config, [([("a", step)], f"t-{step}", "")], ckpt, {"step": step}, {"a": step + 1})


def test_a_commit_sent_soon_is_stored_once_confirmed(saver: PostgresSaver) -> None:
    assert pg_flight.supported()  # the installed psycopg takes the overlapped path
    config = put_steps(saver, 1)
    before = counts(saver)
    (child,), confirm = saver.put_steps_soon([a_step(config, 1)])
    assert confirm is not None
    confirm()
    head = saver.get_tuple(thread())
    assert head is not None and head.config == child
    assert head.checkpoint.channel_values == {"a": 1}
    assert counts(saver) == (before[0] + 1, before[1] + 1)
    stored = saver.get_tuple(config)
    assert stored is not None and ("t-1", "a", 1) in stored.pending_writes


def test_a_commit_whose_connection_dies_in_flight_is_stored_once(
    saver: PostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    land = pg_flight.InFlight.land
    killed: list[int] = []

    def killing(flight: pg_flight.InFlight) -> None:
        pid = flight._conn.info.backend_pid
        killed.extend(r[0] for r in query(saver, "SELECT pg_terminate_backend(%s)", (pid,)))
        land(flight)

    monkeypatch.setattr(pg_flight.InFlight, "land", killing)
    config = put_steps(saver, 1)
    before = counts(saver)
    (child,), confirm = saver.put_steps_soon([a_step(config, 1)])
    assert confirm is not None
    confirm()  # its answer is lost with the connection: sent again, alone
    assert killed == [True]
    assert counts(saver) == (before[0] + 1, before[1] + 1)
    head = saver.get_tuple(thread())
    assert head is not None and head.config == child


def test_a_commit_sent_soon_by_a_stale_coordinator_fails_when_confirmed(
    saver: PostgresSaver,
) -> None:
    stale, config = stale_view(saver)
    before = counts(saver)
    # Raised where the fence's answer is read: while sending, if it came back by then, else
    # when confirmed; nothing is stored either way.
    with pytest.raises(LeaseLostError, match="another coordinator took it over"):
        _, confirm = stale.put_steps_soon([a_step(config, 1)])
        assert confirm is not None
        confirm()
    assert counts(saver) == before


def test_other_threads_commits_wait_for_one_in_flight_then_go_together(
    saver: PostgresSaver,
) -> None:
    config = put_steps(saver, 1)
    (child,), confirm = saver.put_steps_soon([a_step(config, 1)])
    assert confirm is not None
    others = [threading.Thread(target=put_steps, args=(saver, 1, f"other-{i}")) for i in range(3)]
    for other in others:
        other.start()
    deadline = time.monotonic() + 10
    while saver._shared.commits.waiting < 3:
        assert time.monotonic() < deadline, "the other commits did not wait"
        time.sleep(0.002)
    assert all(other.is_alive() for other in others)
    confirm()
    for other in others:
        other.join(10)
        assert not other.is_alive()
    for i in range(3):
        assert saver.get_tuple(thread(f"other-{i}")) is not None
    head = saver.get_tuple(thread())
    assert head is not None and head.config == child
    # A commit sent while others are on the wire goes with them, confirmed at once.
    assert saver._shared.commits.take()
    try:
        sent = threading.Thread(target=saver.put_steps_soon, args=([a_step(child, 2)],))
        sent.start()
        while saver._shared.commits.waiting < 1:
            assert time.monotonic() < deadline + 10, "the commit did not wait"
            time.sleep(0.002)
    finally:
        saver._shared.commits.give_back()
    sent.join(10)
    assert not sent.is_alive()
    head = saver.get_tuple(thread())
    assert head is not None and head.checkpoint.channel_values == {"a": 2}


def test_a_pool_without_autocommit_confirms_a_commit_at_once(pg_schema: str) -> None:
    with ConnectionPool(pg_schema, min_size=1, max_size=2, open=True) as pool:
        pg_saver = PostgresSaver(pool)
        config = put_steps(pg_saver, 1)
        (child,), confirm = pg_saver.put_steps_soon([a_step(config, 1)])
        assert confirm is None  # its sync would not end the transaction: sent as before
        head = pg_saver.get_tuple(thread())
        assert head is not None and head.config == child


def test_metadata_with_nul_is_refused(saver: PostgresSaver) -> None:
    with pytest.raises(SerializationError, match="NUL character"):
        saver.put(thread(), checkpoint(0, {}, {}), {"note": "a\x00b"}, {})
    assert saver.get_tuple(thread()) is None
    # A backslash followed by "u0000" is ordinary text.
    config = saver.put(thread(), checkpoint(0, {}, {}), {"note": "\\u0000"}, {})
    found = saver.get_tuple(config)
    assert found is not None
    assert found.metadata == {"note": "\\u0000"}


def test_pool_without_autocommit(pg_schema: str, caplog: pytest.LogCaptureFixture) -> None:
    with ConnectionPool(pg_schema, min_size=1, max_size=2, open=True) as pool:
        pg_saver = PostgresSaver(pool)
        config = put_steps(pg_saver, 3)
        assert pg_saver.acquire_lease("t1", "a", 30) == 1
        assert len(list(pg_saver.list(thread()))) == 3
        assert pg_saver.get_tuple(config) is not None
        expire(pg_saver, "t1")
        assert pg_saver.acquire_lease("t1", "b", 30) == 2
        before = counts(pg_saver)
        with pytest.raises(LeaseLostError, match="fencing token 2"):
            pg_saver.fenced("t1", 1).put(config, checkpoint(9, {"a": 9}, {"a": 9}), {}, {"a": 9})
        assert counts(pg_saver) == before
    # Every connection went back to the pool idle: nothing had to be rolled back.
    assert "rolling back" not in caplog.text


# --- connection errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("postgresql://postgres:s3cret@127.0.0.1:1/test", "postgresql://postgres:***@127.0.0.1:1"),
        ("host=127.0.0.1 port=1 password=s3cret dbname=test", "password=***"),
        ("not a connection string", "not a connection string"),
    ],
)
def test_unreachable_database_names_the_url_without_password(url: str, where: str) -> None:
    with (
        pytest.raises(ServiceUnavailableError, match="BULKSYNC_DATABASE_URL") as caught,
        PostgresSaver.from_conn_string(url, connect_timeout=2),
    ):
        pass
    assert where in str(caught.value)
    assert "s3cret" not in str(caught.value)


# --- leases -----------------------------------------------------------------------------


def renewed(saver: PostgresSaver, thread_id: str, owner: str, token: int) -> bool:
    """Whether ``owner`` renewed its lease of ``thread_id`` with ``token``."""
    return saver.renew_leases(owner, {thread_id: token}, 30) == {thread_id}


def test_leases_renew_together_and_only_with_their_token(saver: PostgresSaver) -> None:
    for thread in ("t1", "t2", "t3"):
        assert saver.acquire_lease(thread, "a", 30) == 1
    assert saver.acquire_lease("t4", "b", 30) == 1
    leases = {"t1": 1, "t2": 1, "t3": 2, "t4": 1, "unknown": 1}
    assert saver.renew_leases("a", leases, 30) == {"t1", "t2"}
    assert saver.renew_leases("a", {}, 30) == set()


def test_lease_acquire_renew_release(saver: PostgresSaver) -> None:
    assert saver.acquire_lease("t", "a", 30) == 1
    assert saver.acquire_lease("t", "a", 30) == 1  # the holder again: same token, later expiry
    assert saver.acquire_lease("t", "b", 30) is None
    assert renewed(saver, "t", "a", 1) is True
    assert renewed(saver, "t", "b", 1) is False
    assert renewed(saver, "t", "a", 2) is False
    saver.release_lease("t", "b", 1)  # not b's: nothing happens
    assert saver.acquire_lease("t", "b", 30) is None
    saver.release_lease("t", "a", 1)
    assert saver.acquire_lease("t", "b", 30) == 2
    assert saver.acquire_lease("t", "a", 30) is None
    assert renewed(saver, "t", "a", 1) is False
    assert saver.acquire_lease("other", "a", 30) == 1  # tokens count per thread


def test_expired_lease_changes_hands_with_a_new_token(saver: PostgresSaver) -> None:
    assert saver.acquire_lease("t", "a", 30) == 1
    expire(saver, "t")
    assert saver.acquire_lease("t", "b", 30) == 2
    assert renewed(saver, "t", "a", 1) is False
    assert saver.acquire_lease("t", "a", 30) is None
    expire(saver, "t")
    # The same owner coming back after expiry or release also gets a new token.
    assert saver.acquire_lease("t", "b", 30) == 3
    saver.release_lease("t", "b", 3)
    assert saver.acquire_lease("t", "b", 30) == 4


def test_expired_lease_not_taken_can_be_renewed(saver: PostgresSaver) -> None:
    assert saver.acquire_lease("t", "a", 30) == 1
    expire(saver, "t")
    assert renewed(saver, "t", "a", 1) is True
    assert saver.acquire_lease("t", "b", 30) is None


def test_racing_acquirers_one_wins(saver: PostgresSaver) -> None:
    barrier = threading.Barrier(8)
    tokens: dict[str, int | None] = {}

    def acquire(owner: str) -> None:
        barrier.wait()
        tokens[owner] = saver.acquire_lease("race", owner, 30)

    workers = [threading.Thread(target=acquire, args=(f"o{n}",)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(tokens.values(), key=lambda t: t or 0) == [None] * 7 + [1]


def test_delete_thread_keeps_the_lease_counting(saver: PostgresSaver) -> None:
    assert saver.acquire_lease("t1", "a", 30) == 1
    put_steps(saver, 1)
    saver.delete_thread("t1")
    expire(saver, "t1")
    assert saver.acquire_lease("t1", "b", 30) == 2


@pytest.mark.parametrize("ttl", [0, -1.0, float("nan"), float("inf")])
def test_lease_ttl_must_be_positive(saver: PostgresSaver, ttl: float) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        saver.acquire_lease("t", "a", ttl)
    with pytest.raises(ValueError, match="positive number of seconds"):
        saver.renew_leases("a", {"t": 1}, ttl)


# --- fencing ----------------------------------------------------------------------------


def test_stale_coordinator_cannot_commit(saver: PostgresSaver) -> None:
    token_a = saver.acquire_lease("t1", "a", 30)
    assert token_a == 1
    stale = saver.fenced("t1", token_a)
    config = stale.put(thread(), checkpoint(0, {"a": 0}, {"a": 1}), {}, {"a": 1})
    expire(saver, "t1")
    token_b = saver.acquire_lease("t1", "b", 30)
    assert token_b == 2
    before = counts(saver)
    with pytest.raises(LeaseLostError, match="thread 't1': another coordinator took it over"):
        stale.put(config, checkpoint(1, {"a": "stale"}, {"a": 2}), {}, {"a": 2})
    assert counts(saver) == before
    latest = saver.get_tuple(thread())
    assert latest is not None
    assert latest.config == config
    current = saver.fenced("t1", token_b)
    new = current.put(config, checkpoint(2, {"a": "new"}, {"a": 2}), {}, {"a": 2})
    # put_writes is not fenced: the first result of a task wins whoever records it.
    stale.put_writes(new, [("a", "from stale")], "task")
    latest = saver.get_tuple(thread())
    assert latest is not None
    assert latest.config == new
    assert latest.pending_writes == (("task", "a", "from stale"),)


def test_a_view_fenced_on_an_empty_thread_reads_its_head_only_after_a_put(
    saver: PostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = saver.acquire_lease("t1", "a", 30)
    assert token == 1
    view = saver.fenced("t1", token, empty=True)
    reads: list[str] = []
    read_page = view._read_page
    monkeypatch.setattr(
        view, "_read_page", lambda sql, params: reads.append(sql) or read_page(sql, params)
    )
    assert view.get_tuple(thread()) is None
    assert reads == []  # the thread's head: known to be missing, not asked for
    view.get_tuple({"configurable": {"thread_id": "t1", "checkpoint_ns": "child"}})
    view.get_tuple({"configurable": {"thread_id": "t2"}})
    assert len(reads) == 2  # another namespace or thread: read
    config = view.put(thread(), checkpoint(0, {"a": 0}, {"a": 1}), {}, {"a": 1})
    latest = view.get_tuple(thread())
    assert latest is not None and latest.config == config
    assert len(reads) == 3
    # Without ``empty``, the head is read as always.
    assert saver.fenced("t1", token).get_tuple(thread()) == latest


def test_fenced_put_without_a_lease_is_refused(saver: PostgresSaver) -> None:
    with pytest.raises(LeaseLostError, match="no lease row"):
        saver.fenced("t1", 1).put(thread(), checkpoint(0, {"a": 0}, {"a": 1}), {}, {"a": 1})
    assert counts(saver) == (0, 0)


def test_expiry_alone_does_not_refuse_a_commit(saver: PostgresSaver) -> None:
    assert saver.acquire_lease("t1", "a", 30) == 1
    expire(saver, "t1")
    fenced = saver.fenced("t1", 1)
    fenced.put(thread(), checkpoint(0, {"a": 0}, {"a": 1}), {}, {"a": 1})
    # Other threads are not fenced by this view.
    fenced.put(thread("t2"), checkpoint(1, {"a": 0}, {"a": 1}), {}, {"a": 1})
    assert counts(saver) == (2, 2)


def test_takeover_waits_for_a_commit_in_flight(saver: PostgresSaver) -> None:
    assert saver.acquire_lease("t1", "a", 30) == 1
    expire(saver, "t1")
    result: list[int | None] = []
    with saver.pool.connection() as conn, conn.transaction():
        conn.execute(FENCE_SQL, ("t1", 1))  # what a fenced put holds until it commits
        taker = threading.Thread(target=lambda: result.append(saver.acquire_lease("t1", "b", 30)))
        taker.start()
        deadline = time.monotonic() + 20
        while not waiting_on_a_lock(saver, "bulksync_thread_leases") and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert waiting_on_a_lock(saver, "bulksync_thread_leases")
        assert result == []
    taker.join()
    assert result == [2]


def waiting_on_a_lock(saver: PostgresSaver, naming: str) -> bool:
    """Whether a statement whose text contains ``naming`` waits for a lock."""
    rows = query(
        saver,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        (f"%{naming}%",),
    )
    return bool(rows[0][0])


def test_several_steps_are_stored_in_one_transaction(saver: PostgresSaver) -> None:
    first = checkpoint(0, {"a": 0}, {"a": 1})
    second = checkpoint(1, {"a": 1}, {"a": 2})
    configs = saver.put_steps(
        [
            (thread(), [], first, {"step": -1}, {"a": 1}),
            (saver_config(first), [([("a", "x")], "t-x", "p")], second, {"step": 0}, {"a": 2}),
        ]
    )
    assert configs == [saver_config(first), saver_config(second)]
    head = saver.get_tuple(thread())
    assert head is not None and head.config == configs[1]
    assert head.parent_config == configs[0]
    parent = saver.get_tuple(configs[0])
    assert parent is not None and list(parent.pending_writes) == [("t-x", "a", "x")]


def test_steps_a_stale_coordinator_commits_store_nothing(saver: PostgresSaver) -> None:
    stale = saver.fenced("t1", saver.acquire_lease("t1", "a", 30) or 0)
    expire(saver, "t1")
    assert saver.acquire_lease("t1", "b", 30) == 2
    first = checkpoint(0, {"a": 0}, {"a": 1})
    with pytest.raises(LeaseLostError, match="another coordinator took it over"):
        stale.put_steps(
            [
                (thread(), [], first, {}, {"a": 1}),
                (saver_config(first), [], checkpoint(1, {"a": 1}, {"a": 2}), {}, {"a": 2}),
            ]
        )
    assert saver.get_tuple(thread()) is None


def saver_config(ckpt: Checkpoint, thread_id: str = "t1") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": ckpt.id}}
