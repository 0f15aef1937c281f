"""Detached runs: the ``bulksync_runs`` table, the queue coordinators take their work from.

One row per run (created by migration 7 in ``pg_migrations.py``)::

    run_id              text     the run's id (also its Redis event stream: keys.events)
    seq                 bigint   submission order; "oldest first" means lowest seq
    thread_id           text     the thread it runs on (generated when the caller gave none)
    graph_id            text     ``pkg.module:attr``, as the coordinator loaded it
    kind                text     invoke | stream | get_state | get_state_history | update_state
    status              text     pending | running | interrupted | success | error |
                                 cancelled | timeout
    payload             bytea    msgpack (``wire.SERDE``) dict: input or command, config,
                                 stream modes, options — whatever the kind needs
    output              bytea    msgpack result; for error/timeout/cancelled the error record
                                 (``wire.dumps_error``) so the caller re-raises its type
    error               text     the error message of a run that failed
    multitask_strategy  text     reject | enqueue
    owner               text     the coordinator driving (or last drove) the run
    heartbeat_at        timestamptz  the owner's last sign of life while running
    cancel_requested    boolean  set by ``request_cancel`` on a running run
    attempts            integer  how many times a coordinator claimed it
    start_checkpoint    text     the thread's head checkpoint when the run was first driven,
    start_writes        integer  and how many input (null-task) writes it had: a coordinator
                                 taking the run over compares them with the thread now to
                                 tell whether the input was already applied
    created_at, updated_at timestamptz

Postgres is the truth; Redis only wakes coordinators up. A thread runs at most one *writer*
run (invoke, stream, update_state) at a time: later ones wait ("enqueue") or are refused
("reject"). Reads (``get_state``, ``get_state_history``) never wait and never block. A
coordinator claims only runs of the graphs it loaded; the others wait for one that did.

**A thread belongs to one graph**: the graph of its first writer run, which
``bulksync_threads`` records. ``create`` refuses a run or read of the
thread with any other graph (``ThreadGraphError``) in the transaction that would insert it,
so the rule holds for every client (``Client``, ``RemoteGraph``, the CLI, the HTTP API):
another graph would read the thread's checkpoints with the wrong channels and nodes, and
its writes would break the thread for its own graph.

**Events and wake-ups** live in Redis: ``events.py``.

**Outages.** ``RunStore`` calls are retried through a Postgres outage of up to
``retry_window`` seconds, like ``PostgresSaver``'s; each is safe to run twice (a retried
``create`` or ``finish`` whose first attempt committed before its reply was lost finds its
own row and reports it). ``claim`` and ``take_over_stale`` are not retried: the coordinator
calls them again on its next turn, and a claim whose reply was lost is released as stale.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Final, NamedTuple, TypeVar

from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from bulksync.checkpoint import pg_migrations as pgm
from bulksync.checkpoint.postgres import RETRY_WINDOW, is_transient_postgres
from bulksync.constants import NULL_TASK_ID
from bulksync.errors import (
    BulkSyncError,
    ConfigError,
    TaskCancelledError,
    TaskTimeoutError,
    ThreadBusyError,
    ThreadGraphError,
)
from bulksync.retry import retry
from bulksync.workers import wire

PENDING: Final = "pending"
RUNNING: Final = "running"
INTERRUPTED: Final = "interrupted"
SUCCESS: Final = "success"
ERROR: Final = "error"
CANCELLED: Final = "cancelled"
TIMEOUT: Final = "timeout"
STATUSES: Final = (PENDING, RUNNING, INTERRUPTED, SUCCESS, ERROR, CANCELLED, TIMEOUT)
FINISHED: Final = frozenset({INTERRUPTED, SUCCESS, ERROR, CANCELLED, TIMEOUT})
FAILED: Final = frozenset({ERROR, CANCELLED, TIMEOUT})

KINDS: Final = ("invoke", "stream", "get_state", "get_state_history", "update_state")
READ_KINDS: Final = ("get_state", "get_state_history")
STRATEGIES: Final = ("reject", "enqueue")

_COLUMNS = (
    "run_id, thread_id, graph_id, kind, status, payload, output, error, multitask_strategy, "
    "owner, heartbeat_at, cancel_requested, attempts, start_checkpoint, start_writes, "
    "created_at, updated_at"
)
_READS = "('get_state', 'get_state_history')"
# Per thread, so two submissions to one thread cannot both see it idle ("reject").
_THREAD_LOCK = (
    "pg_advisory_xact_lock(hashtextextended("
    "'bulksync_runs:' || coalesce(current_schema(), '') || ':' || {thread}, 0))"
)
_THREAD_LOCK_SQL = "SELECT " + _THREAD_LOCK.format(thread="%s")
T = TypeVar("T")

# Under the thread's lock (taken by the statement before, in the same transaction): the
# thread's graph and its active writer run (looked for only when the strategy refuses a
# busy thread), and the new run, inserted only when neither refuses it. A writer run
# binds its thread to its graph if nothing did yet (the ``bulksync_threads`` table, which
# ``threads.py`` reads). "" is a read across threads (a history without a thread): bound
# to no graph.
_CREATE_SQL = f"""WITH bound AS (
        SELECT graph_id FROM bulksync_threads WHERE thread_id = %(thread)s
        AND %(thread)s <> ''),
    active AS (
        SELECT run_id, status FROM bulksync_runs WHERE %(refuse_busy)s
        AND thread_id = %(thread)s AND status IN ('pending', 'running')
        AND kind NOT IN {_READS} ORDER BY seq LIMIT 1),
    inserted AS (
        INSERT INTO bulksync_runs (run_id, thread_id, graph_id, kind, payload,
            multitask_strategy)
        SELECT %(run)s, %(thread)s, %(graph)s, %(kind)s, %(payload)s, %(strategy)s
        WHERE NOT EXISTS (SELECT 1 FROM bound WHERE graph_id <> %(graph)s)
        AND NOT EXISTS (SELECT 1 FROM active)
        RETURNING {_COLUMNS}),
    touched AS (
        INSERT INTO bulksync_threads (thread_id, graph_id)
        SELECT thread_id, graph_id FROM inserted WHERE kind NOT IN {_READS}
        ON CONFLICT (thread_id) DO UPDATE SET updated_at = clock_timestamp(),
        graph_id = coalesce(bulksync_threads.graph_id, EXCLUDED.graph_id))
    SELECT inserted.*, (SELECT graph_id FROM bound) AS bound_graph,
        active.run_id AS active_run, active.status AS active_status
    FROM (SELECT 1) AS one LEFT JOIN inserted ON true LEFT JOIN active ON true"""
# Oldest first; a writer only when no writer of its thread runs or waits ahead of it.
# SKIP LOCKED: coordinators claiming at once take different runs instead of queueing.
_CLAIM_SQL = f"""WITH picked AS (
    SELECT r.run_id FROM bulksync_runs r
    WHERE r.status = 'pending' AND r.graph_id = ANY(%(graphs)s) AND (r.kind IN {_READS} OR (
        NOT EXISTS (SELECT 1 FROM bulksync_runs a WHERE a.thread_id = r.thread_id
                    AND a.status = 'running' AND a.kind NOT IN {_READS})
        AND NOT EXISTS (SELECT 1 FROM bulksync_runs o WHERE o.thread_id = r.thread_id
                    AND o.status = 'pending' AND o.kind NOT IN {_READS} AND o.seq < r.seq)))
    ORDER BY r.seq LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED)
UPDATE bulksync_runs r SET status = 'running', owner = %(owner)s, heartbeat_at = now(),
    updated_at = now(), attempts = r.attempts + 1
    FROM picked WHERE r.run_id = picked.run_id
    RETURNING {", ".join(f"r.{c.strip()}" for c in _COLUMNS.split(","))}"""
_HEARTBEAT_SQL = """UPDATE bulksync_runs SET heartbeat_at = now()
    WHERE owner = %s AND status = 'running' AND run_id = ANY(%s) RETURNING run_id"""
_STALE_SQL = f"""UPDATE bulksync_runs SET
    status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END,
    error = CASE WHEN cancel_requested THEN 'cancelled while its coordinator was lost'
                 ELSE error END,
    owner = NULL, heartbeat_at = NULL, updated_at = now()
    WHERE status = 'running' AND heartbeat_at < now() - make_interval(secs => %s)
    RETURNING {_COLUMNS}"""
# The runs a claim takes, selected again by the statements after it in its transaction:
# now() is the transaction's start, the same in each of them, and no other transaction
# can have set it as this owner's running runs' updated_at.
_CLAIMED = f"""r.owner = %(owner)s AND r.status = 'running' AND r.updated_at = now()
    AND r.kind NOT IN {_READS}"""
_LEASE_CLAIMED_SQL = pgm.acquire_sql(
    f"""SELECT DISTINCT r.thread_id, %(owner)s, 1, now() + make_interval(secs => %(ttl)s)
    FROM bulksync_runs r WHERE {_CLAIMED} ORDER BY 1"""
)


def _started_sql(runs: str) -> str:
    """Of the runs ``runs`` selects (as ``r``) whose thread's lease the caller holds: the
    lease's token and the thread's head — its latest root checkpoint and how many input
    writes it has (the saver's tables, read without their values) —, recorded on a run the
    first time only."""
    return f"""WITH leased AS (
        SELECT r.run_id, r.thread_id, l.token FROM bulksync_runs r
        JOIN bulksync_thread_leases l ON l.thread_id = r.thread_id
            AND l.owner = %(owner)s AND l.expires_at > now()
        WHERE {runs}),
    head AS (
        SELECT s.run_id, s.token, h.checkpoint_id, coalesce(h.writes, 0) AS writes
        FROM leased s LEFT JOIN LATERAL (
            SELECT c.checkpoint_id, (SELECT count(*) FROM bulksync_checkpoint_writes w
                WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = ''
                AND w.checkpoint_id = c.checkpoint_id AND w.task_id = %(input)s)::int AS writes
            FROM bulksync_checkpoints c WHERE c.thread_id = s.thread_id AND c.checkpoint_ns = ''
            ORDER BY c.checkpoint_id DESC LIMIT 1) h ON true),
    marked AS (
        UPDATE bulksync_runs r SET start_checkpoint = head.checkpoint_id,
            start_writes = head.writes
        FROM head WHERE r.run_id = head.run_id AND r.owner = %(owner)s
        AND r.status = 'running' AND r.start_writes IS NULL)
    SELECT run_id, token, checkpoint_id, writes FROM head"""


_STARTED_SQL = _started_sql("r.run_id = %(run)s")
_STARTED_CLAIMED_SQL = _started_sql(_CLAIMED)
# The run's thread's lock first (as a submission takes it): a writer run queued behind this
# one either is seen by the statement after, or is inserted once this end is committed.
_FINISH_LOCK_SQL = f"""SELECT {_THREAD_LOCK.format(thread="thread_id")}
    FROM bulksync_runs WHERE run_id = %s AND kind NOT IN {_READS}"""
_FINISH_SQL = f"""UPDATE bulksync_runs r SET status = %s, output = %s, error = %s,
    updated_at = now() WHERE run_id = %s AND owner = %s AND status = 'running'
    RETURNING {_COLUMNS}, r.kind NOT IN {_READS} AND EXISTS (SELECT 1 FROM bulksync_runs q
        WHERE q.thread_id = r.thread_id AND q.status = 'pending'
        AND q.kind NOT IN {_READS}) AS queued"""


Started = tuple[int, str | None, int]
"""A writer run's start (``RunStore.start``): its thread's lease token, and the thread's
head checkpoint id (None: no checkpoint yet) with its number of input writes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One row of ``bulksync_runs``; ``payload``/``output`` are decoded on access."""

    run_id: str
    thread_id: str
    graph_id: str
    kind: str
    status: str
    payload_bytes: bytes
    output_bytes: bytes | None
    error: str | None
    multitask_strategy: str
    owner: str | None
    heartbeat_at: datetime | None
    cancel_requested: bool
    attempts: int
    start_checkpoint: str | None
    start_writes: int | None
    created_at: datetime
    updated_at: datetime

    @property
    def finished(self) -> bool:
        """Whether the run reached a final status (``interrupted`` included)."""
        return self.status in FINISHED

    @property
    def payload(self) -> dict[str, Any]:
        """What the run was asked to do (input, config, options)."""
        value: dict[str, Any] = wire.SERDE.loads(self.payload_bytes)
        return value

    @property
    def output(self) -> Any:
        """The result of a successful or interrupted run (None otherwise)."""
        if self.output_bytes is None or self.status in FAILED:
            return None
        return wire.SERDE.loads(self.output_bytes)

    def exception(self) -> BaseException | None:
        """The error that ended a failed run, of its original type where that is loaded."""
        if self.status not in FAILED:
            return None
        if self.output_bytes is not None:
            return wire.loads_error(self.output_bytes)
        message = self.error or f"run {self.run_id} ended with status {self.status}"
        if self.status == CANCELLED:
            return TaskCancelledError(message)
        if self.status == TIMEOUT:
            return TaskTimeoutError(message)
        return BulkSyncError(message)


class Finished(NamedTuple):
    """A run's final row, and whether a writer run of its thread is queued behind it: its
    end lets that one start (``RunStore.finish``)."""

    run: Run
    queued: bool


class Claim(NamedTuple):
    """A run a coordinator claimed, and its start if the claim took its lease."""

    run: Run
    started: Started | None


class RunStore:
    """Runs in Postgres, through a psycopg pool (the same database as ``PostgresSaver``)."""

    def __init__(self, pool: ConnectionPool[Any], *, retry_window: float = RETRY_WINDOW) -> None:
        self.pool = pool
        self.retry_window = retry_window

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, url: str, *, max_size: int, retry_window: float = RETRY_WINDOW
    ) -> Iterator[RunStore]:
        """Open a pool of ``max_size`` connections for the ``with`` block; apply the migrations.

        ``max_size`` is a setting (``runs_pool_size`` for a client), ``retry_window`` too.

        Raises:
            ServiceUnavailableError: Postgres cannot be reached at ``url`` (named).
        """
        from bulksync.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(
            url, max_size=max_size, retry_window=retry_window
        ) as saver:
            saver.setup()
            yield cls(saver.pool, retry_window=retry_window)

    def setup(self) -> None:
        """Apply the migrations this database lacks (the runs table is one of them)."""

        def apply(_: int) -> None:
            with self.pool.connection() as conn:
                pgm.apply_migrations(conn, pgm.MIGRATIONS)

        self._retry(apply, "applying migrations")

    def _retry(self, call: Callable[[int], T], what: str) -> T:
        """``call(attempt)`` (1, 2, …), retried while Postgres is unreachable."""
        attempts = iter(range(1, 1 << 30))
        return retry(
            lambda: call(next(attempts)),
            transient=is_transient_postgres,
            window=self.retry_window,
            what=f"Postgres: {what}",
        )

    def create(
        self,
        *,
        graph_id: str,
        thread_id: str,
        kind: str,
        payload: Mapping[str, Any],
        multitask_strategy: str = "enqueue",
        run_id: str | None = None,
    ) -> Run:
        """Queue a run; it starts once no earlier writer run of its thread is active.

        Raises:
            ThreadGraphError: the thread belongs to another graph (both named).
            ThreadBusyError: ``multitask_strategy="reject"`` and the thread has a pending or
                running writer run (named).
            ConfigError: an unknown kind or strategy (a ``ValueError``).
            SerializationError: the payload holds a value msgpack cannot encode.
        """
        if kind not in KINDS:
            raise ConfigError(f"unknown run kind {kind!r}; use one of {KINDS}")
        if multitask_strategy not in STRATEGIES:
            raise ConfigError(
                f"multitask_strategy={multitask_strategy!r}: use 'enqueue' (wait for the "
                "thread's active run) or 'reject' (refuse while the thread is busy)."
            )
        run_id = run_id or str(uuid.uuid4())
        args: dict[str, Any] = {
            "run": run_id,
            "thread": thread_id,
            "graph": graph_id,
            "kind": kind,
            "payload": wire.SERDE.dumps(dict(payload)),
            "strategy": multitask_strategy,
            "refuse_busy": multitask_strategy == "reject" and kind not in READ_KINDS,
        }

        def insert(attempt: int) -> Run:
            if attempt > 1:  # the first attempt may have committed before its reply was lost
                existing = self._get(run_id)
                if existing is not None:
                    return existing
            return self._insert(args)

        return self._retry(insert, f"creating run {run_id}")

    def _insert(self, args: Mapping[str, Any]) -> Run:
        # One round trip: the lock and the insert, one implicit transaction.
        with self.pool.connection() as conn:
            with conn.pipeline():
                conn.execute(_THREAD_LOCK_SQL, (args["thread"],))
                created = conn.cursor(row_factory=dict_row).execute(_CREATE_SQL, args)
            row = created.fetchone()
        assert row is not None  # the statement always has its one row
        if row["run_id"] is not None:
            return _run(row)
        bound = row["bound_graph"]
        if bound is not None and bound != args["graph"]:
            raise _other_graph(args["thread"], bound, args["graph"])
        raise ThreadBusyError(
            f"thread '{args['thread']}' is busy with run {row['active_run']} "
            f"({row['active_status']}); wait for it (bulksync runs --thread "
            f"{args['thread']}) or submit with multitask_strategy='enqueue' to queue "
            "behind it."
        )

    def claim(
        self, owner: str, limit: int, graph_ids: Sequence[str], *, lease_ttl: float | None = None
    ) -> list[Claim]:
        """Mark up to ``limit`` runnable runs of ``graph_ids`` as running for ``owner``.

        Oldest first; a writer run only when no earlier writer of its thread is active,
        whatever its graph. Runs of other graphs are left to coordinators that loaded them.

        With ``lease_ttl``, the claim also starts its writer runs, in the same round trip:
        each claim's ``started`` is what :meth:`start` would return (None for a read, or
        while another owner's lease on the thread is live).
        """
        if limit < 1 or not graph_ids:
            return []
        args = {
            "owner": owner,
            "limit": limit,
            "graphs": list(graph_ids),
            "ttl": lease_ttl,
            "input": NULL_TASK_ID,
        }
        with self.pool.connection() as conn:
            with conn.pipeline():  # one transaction, whose now() marks the runs claimed
                claimed = conn.cursor(row_factory=dict_row).execute(_CLAIM_SQL, args)
                if lease_ttl is not None:
                    conn.execute(_LEASE_CLAIMED_SQL, args)
                    heads = conn.execute(_STARTED_CLAIMED_SQL, args)
            rows = claimed.fetchall()
            started = {} if lease_ttl is None else dict(_started(r) for r in heads.fetchall())
        found = sorted((_run(r) for r in rows), key=lambda r: r.created_at)
        return [Claim(run, started.get(run.run_id)) for run in found]

    def heartbeat(self, owner: str, run_ids: Sequence[str]) -> set[str]:
        """Refresh ``owner``'s running runs; return those it still owns."""
        if not run_ids:
            return set()

        def beat(_: int) -> set[str]:
            with self.pool.connection() as conn:
                rows = conn.execute(_HEARTBEAT_SQL, (owner, list(run_ids))).fetchall()
            return {r[0] for r in rows}

        return self._retry(beat, "heartbeat")

    def take_over_stale(self, stale_after: float) -> list[Run]:
        """Make runs whose owner has not heartbeated for ``stale_after`` seconds claimable.

        A run whose cancel was requested becomes ``cancelled`` instead. Returns the runs
        changed, with their new status.
        """
        with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return [_run(r) for r in cur.execute(_STALE_SQL, (float(stale_after),)).fetchall()]

    def start(self, run_id: str, owner: str, thread_id: str, lease_ttl: float) -> Started | None:
        """Take the lease of the run's thread for ``owner`` (as ``acquire_lease`` of the
        saver does) and record the thread's head when the run is first driven (later calls
        change nothing), in one round trip.

        Returns None while another owner's lease on the thread is live (nothing recorded);
        else the lease's fencing token and the head as it is now: its checkpoint id (None:
        no checkpoint yet) and how many input writes it holds.
        """

        def start(_: int) -> Started | None:
            args = {
                "input": NULL_TASK_ID,
                "thread": thread_id,
                "run": run_id,
                "owner": owner,
                "ttl": float(lease_ttl),
            }
            with self.pool.connection() as conn:
                with conn.pipeline():  # one transaction: the head is recorded under the lease
                    conn.execute(pgm.ACQUIRE_SQL, args)
                    head = conn.execute(_STARTED_SQL, args)
                row = head.fetchone()
            return None if row is None else _started(row)[1]

        return self._retry(start, f"starting run {run_id}")

    def finish(
        self,
        run_id: str,
        owner: str,
        status: str,
        *,
        output: bytes | None = None,
        error: str | None = None,
        lease: tuple[str, int] | None = None,
    ) -> Finished | None:
        """Set a running run's final status; return its final row, or None when ``owner``
        no longer drives it.

        ``lease``, the run's thread lease ``(thread id, token)``, is released in the same
        round trip (if ``owner`` still holds it with that token).
        """
        if status not in FINISHED:
            raise ConfigError(f"{status!r} is not a final status; use one of {sorted(FINISHED)}")

        def finish(attempt: int) -> Finished | None:
            with self.pool.connection() as conn:
                with conn.pipeline():  # one round trip: its results are read after the sync
                    conn.execute(_FINISH_LOCK_SQL, (run_id,))
                    cur = conn.cursor(row_factory=dict_row)
                    cur.execute(_FINISH_SQL, (status, output, error, run_id, owner))
                    if lease is not None:
                        conn.execute(pgm.RELEASE_SQL, (lease[0], owner, lease[1]))
                row = cur.fetchone()
            if row is None and attempt > 1:  # did the first attempt commit, reply lost?
                now = self._get(run_id)
                if now is None or now.owner != owner or now.status != status:
                    return None
                return Finished(now, now.kind not in READ_KINDS)  # not known: wake anyway
            return None if row is None else Finished(_run(row), bool(row["queued"]))

        return self._retry(finish, f"finishing run {run_id}")

    def request_cancel(self, run_id: str) -> tuple[str, Run]:
        """Cancel a run: a pending one at once, a running one by flag (its driver stops it).

        Returns the status before the request and the run after it; a finished run is left
        as it is.

        Raises:
            LookupError: no run has this id.
        """
        return self._retry(lambda _: self._request_cancel(run_id), f"cancelling run {run_id}")

    def _request_cancel(self, run_id: str) -> tuple[str, Run]:
        with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            row = cur.execute(
                f"SELECT {_COLUMNS} FROM bulksync_runs WHERE run_id = %s FOR UPDATE", (run_id,)
            ).fetchone()
            if row is None:
                raise _unknown(run_id)
            before = str(row["status"])
            if before == PENDING:
                sql = """UPDATE bulksync_runs SET status = 'cancelled', cancel_requested = true,
                    error = 'cancelled before it started', updated_at = now() WHERE run_id = %s"""
            elif before == RUNNING:
                sql = """UPDATE bulksync_runs SET cancel_requested = true, updated_at = now()
                    WHERE run_id = %s"""
            else:
                return before, _run(row)
            cur.execute(sql, (run_id,))
            after = cur.execute(
                f"SELECT {_COLUMNS} FROM bulksync_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        assert after is not None
        return before, _run(after)

    def get(self, run_id: str) -> Run | None:
        """The run with this id, if any."""
        return self._retry(lambda _: self._get(run_id), f"reading run {run_id}")

    def _get(self, run_id: str) -> Run | None:
        with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = cur.execute(
                f"SELECT {_COLUMNS} FROM bulksync_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        return None if row is None else _run(row)

    def require(self, run_id: str) -> Run:
        """The run with this id.

        Raises:
            LookupError: no run has this id.
        """
        run = self.get(run_id)
        if run is None:
            raise _unknown(run_id)
        return run

    def list(
        self,
        *,
        thread_id: str | None = None,
        status: str | None = None,
        limit: int = 20,
        offset: int = 0,
        kinds: Sequence[str] | None = None,
    ) -> list[Run]:
        """Runs newest first, optionally of one thread, one status and some ``kinds``."""
        if status is not None and status not in STATUSES:
            raise ConfigError(f"unknown run status {status!r}; use one of {STATUSES}")
        where: list[str] = []
        params: list[Any] = []
        if kinds is not None:
            where.append("kind = ANY(%s)")
            params.append(list(kinds))
        if thread_id is not None:
            where.append("thread_id = %s")
            params.append(thread_id)
        if status is not None:
            where.append("status = %s")
            params.append(status)
        sql = f"SELECT {_COLUMNS} FROM bulksync_runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY seq DESC LIMIT {max(0, int(limit))} OFFSET {max(0, int(offset))}"

        def read(_: int) -> list[Run]:
            with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                return [_run(r) for r in cur.execute(sql, params).fetchall()]

        return self._retry(read, "listing runs")

    def delete(self, run_id: str) -> bool:
        """Forget a finished run; whether there was one (an active run is left alone)."""

        def delete(_: int) -> bool:
            with self.pool.connection() as conn:
                cur = conn.execute(
                    "DELETE FROM bulksync_runs WHERE run_id = %s AND status NOT IN "
                    "('pending', 'running')",
                    (run_id,),
                )
                return bool(cur.rowcount > 0)

        return self._retry(delete, f"deleting run {run_id}")


def _run(row: Mapping[str, Any]) -> Run:
    return Run(
        run_id=row["run_id"],
        thread_id=row["thread_id"],
        graph_id=row["graph_id"],
        kind=row["kind"],
        status=row["status"],
        payload_bytes=bytes(row["payload"]),
        output_bytes=None if row["output"] is None else bytes(row["output"]),
        error=row["error"],
        multitask_strategy=row["multitask_strategy"],
        owner=row["owner"],
        heartbeat_at=row["heartbeat_at"],
        cancel_requested=bool(row["cancel_requested"]),
        attempts=int(row["attempts"]),
        start_checkpoint=row["start_checkpoint"],
        start_writes=row["start_writes"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _started(row: Sequence[Any]) -> tuple[str, Started]:
    """A run id and its start, from a row of ``_started_sql``."""
    return str(row[0]), (int(row[1]), row[2], int(row[3]))


def _other_graph(thread_id: str, bound: str, graph_id: str) -> ThreadGraphError:
    """Refusing ``graph_id`` on a thread bound to graph ``bound``."""
    return ThreadGraphError(
        f"thread '{thread_id}' belongs to graph '{bound}', not '{graph_id}'; run or read "
        f"it with graph '{bound}', or use a new thread for '{graph_id}'."
    )


def _unknown(run_id: str) -> LookupError:
    return LookupError(
        f"no run '{run_id}' in this database; check the id (bulksync runs lists recent runs) "
        "and BULKSYNC_DATABASE_URL."
    )
