"""``PostgresSaver``'s group commit, on a real Postgres: commits of several threads made while
another is on the wire share one transaction; anything that fails in it sends each alone.

The first commit of each test is held on the wire by a lease row the test locks (its fence
waits for the lock), so the commits after it queue; which transaction stored a row is read
from the row's ``xmin``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.errors import LeaseLostError
from tests.integration.test_operators import wait_until
from tests.integration.test_postgres_saver import (
    checkpoint,
    counts,
    expire,
    query,
    thread,
    waiting_on_a_lock,
)

pytestmark = pytest.mark.integration

WAIT = 20.0


@pytest.fixture
def saver(pg_schema: str) -> Iterator[PostgresSaver]:
    with PostgresSaver.from_conn_string(pg_schema, max_size=8) as pg_saver:
        pg_saver.setup()
        yield pg_saver


class Holder:
    """Lease rows held by open transactions, as a renewal or a takeover holds one while it
    updates it; whatever a test still holds is let go after it (before its schema goes)."""

    def __init__(self, saver: PostgresSaver) -> None:
        self.saver = saver
        self.held: dict[str, psycopg.Connection[Any]] = {}

    def hold(self, thread_id: str) -> None:
        conn = self.saver.pool.getconn()
        self.held[thread_id] = conn
        conn.execute("BEGIN")
        conn.execute(
            "SELECT 1 FROM bulksync_thread_leases WHERE thread_id = %s FOR UPDATE", (thread_id,)
        )

    def release(self, thread_id: str) -> None:
        conn = self.held.pop(thread_id)
        conn.execute("COMMIT")
        self.saver.pool.putconn(conn)


@pytest.fixture
def rows(saver: PostgresSaver) -> Iterator[Holder]:
    holder = Holder(saver)
    yield holder
    for thread_id in list(holder.held):
        holder.release(thread_id)


class Commit(threading.Thread):
    """One run's step commit (its last result's write and its checkpoint), on a thread."""

    def __init__(self, saver: PostgresSaver, thread_id: str, token: int) -> None:
        super().__init__(name=thread_id)
        self.view = saver.fenced(thread_id, token)
        self.thread_id = thread_id
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        name = self.thread_id
        first = checkpoint(0, {"a": "input"}, {"a": 1})
        parent = {"configurable": {**thread(name)["configurable"], "checkpoint_id": first.id}}
        try:
            self.view.put_steps(
                [
                    (thread(name), [], first, {"step": -1}, {"a": 1}),
                    (
                        parent,
                        [([("a", f"from {name}")], f"task-{name}", "p")],
                        checkpoint(1, {"a": name}, {"a": 2}),
                        {"step": 0},
                        {"a": 2},
                    ),
                ]
            )
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(WAIT)
        assert not self.is_alive(), f"the commit of {self.thread_id} never ended"


def leases(saver: PostgresSaver, *threads: str) -> dict[str, int]:
    tokens = {t: saver.acquire_lease(t, "coordinator", 30) for t in threads}
    assert all(tokens.values())
    return {t: token or 0 for t, token in tokens.items()}


def xmin(saver: PostgresSaver, thread_id: str) -> int:
    """The transaction that stored ``thread_id``'s checkpoints (both in one)."""
    rows = query(
        saver,
        "SELECT DISTINCT xmin::text::bigint FROM bulksync_checkpoints WHERE thread_id = %s",
        (thread_id,),
    )
    assert len(rows) == 1, f"thread {thread_id}'s checkpoints: {len(rows)} transactions"
    return int(rows[0][0])


def stored(saver: PostgresSaver, thread_id: str) -> bool:
    """Whether ``thread_id``'s two checkpoints and its write were stored, as written."""
    head = saver.get_tuple(thread(thread_id))
    if head is None:
        return False
    assert head.checkpoint.channel_values == {"a": thread_id}
    assert head.parent_config is not None
    parent = saver.get_tuple(head.parent_config)
    assert parent is not None
    assert list(parent.pending_writes) == [(f"task-{thread_id}", "a", f"from {thread_id}")]
    return True


def behind_a_commit_in_flight(rows: Holder, tokens: dict[str, int]) -> list[Commit]:
    """t0's commit, then the commits of the other threads of ``tokens`` started while t0's
    is held on the wire (its fence waits for t0's lease row), so they wait for it; then t0's
    row is let go. All the commits, t0's first."""
    saver = rows.saver
    rows.hold("t0")
    first = Commit(saver, "t0", tokens["t0"])
    wait_until(lambda: waiting_on_a_lock(saver, "bulksync_check_lease"), "t0's fence to wait")
    others = [Commit(saver, t, token) for t, token in tokens.items() if t != "t0"]
    wait_until(lambda: saver._shared.commits.waiting == len(others), "the others to queue")
    rows.release("t0")
    return [first, *others]


def test_commits_made_during_one_in_flight_share_the_next_transaction(
    saver: PostgresSaver, rows: Holder
) -> None:
    tokens = leases(saver, "t0", "t1", "t2", "t3")
    first, *others = behind_a_commit_in_flight(rows, tokens)
    for commit in [first, *others]:
        commit.finish()
        assert commit.error is None
        assert stored(saver, commit.thread_id)
    shared = {xmin(saver, t) for t in ("t1", "t2", "t3")}
    assert len(shared) == 1  # one transaction for the three
    assert xmin(saver, "t0") not in shared  # the first went alone
    # A lone commit afterwards goes at once, alone.
    assert Commit(saver, "t4", leases(saver, "t4")["t4"]).join(WAIT) is None
    assert stored(saver, "t4")
    assert xmin(saver, "t4") not in shared


def test_a_lost_lease_fails_its_own_commit_and_the_others_are_stored(
    saver: PostgresSaver, rows: Holder
) -> None:
    tokens = leases(saver, "t0", "t1", "t2", "t3")
    expire(saver, "t2")
    assert saver.acquire_lease("t2", "another coordinator", 30) == tokens["t2"] + 1
    first, *others = behind_a_commit_in_flight(rows, tokens)
    for commit in [first, *others]:
        commit.finish()
    by_thread = {c.thread_id: c for c in others}
    assert isinstance(by_thread["t2"].error, LeaseLostError)
    assert "thread 't2'" in str(by_thread["t2"].error)
    assert not stored(saver, "t2")
    for name in ("t0", "t1", "t3"):
        assert by_thread.get(name, first).error is None
        assert stored(saver, name)
    # The shared transaction stored nothing; t1 and t3 were then committed each alone.
    assert xmin(saver, "t1") != xmin(saver, "t3")
    assert counts(saver)[0] == 6  # two checkpoints for each of t0, t1 and t3


def test_a_shared_commit_does_not_wait_for_a_lease_row_held_elsewhere(
    saver: PostgresSaver, rows: Holder
) -> None:
    tokens = leases(saver, "t0", "t1", "t2", "t3")
    rows.hold("t3")  # while, say, a renewal updates t3's row
    first, t1, t2, t3 = behind_a_commit_in_flight(rows, tokens)
    for commit in (first, t1, t2):
        commit.finish()  # without waiting for t3's row
        assert commit.error is None
        assert stored(saver, commit.thread_id)
    assert t3.is_alive()  # alone, its fence waits for the row, as any commit's does
    assert not stored(saver, "t3")
    rows.release("t3")
    t3.finish()
    assert t3.error is None
    assert stored(saver, "t3")


class Interrupted(BaseException):
    """What stops a thread without being an error of its commit (as ``KeyboardInterrupt``)."""


def test_an_interrupted_round_leaves_the_others_to_commit_alone(
    saver: PostgresSaver, rows: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit_once = PostgresSaver._commit_once

    def interrupted(self: PostgresSaver, batch: Any) -> None:
        if len(batch) > 1:
            raise Interrupted
        commit_once(self, batch)

    monkeypatch.setattr(PostgresSaver, "_commit_once", interrupted)
    tokens = leases(saver, "t0", "t1", "t2", "t3")
    first, *others = behind_a_commit_in_flight(rows, tokens)
    for commit in [first, *others]:
        commit.finish()
    sender = [c for c in others if c.error is not None]
    assert len(sender) == 1 and isinstance(sender[0].error, Interrupted)
    assert not stored(saver, sender[0].thread_id)
    for commit in [first, *others]:
        if commit is not sender[0]:
            assert commit.error is None
            assert stored(saver, commit.thread_id)  # alone, not lost with the round
