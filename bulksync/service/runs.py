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
from bulksync.checkpoint.pg_pool import RETRY_WINDOW, is_transient_postgres
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
from bulksync.service import runs_sql as sql
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

T = TypeVar("T")


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
                conn.execute(sql.THREAD_LOCK_SQL, (args["thread"],))
                created = conn.cursor(row_factory=dict_row).execute(sql.CREATE_SQL, args)
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
                claimed = conn.cursor(row_factory=dict_row).execute(sql.CLAIM_SQL, args)
                if lease_ttl is not None:
                    conn.execute(sql.LEASE_CLAIMED_SQL, args)
                    heads = conn.execute(sql.STARTED_CLAIMED_SQL, args)
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
                rows = conn.execute(sql.HEARTBEAT_SQL, (owner, list(run_ids))).fetchall()
            return {r[0] for r in rows}

        return self._retry(beat, "heartbeat")

    def take_over_stale(self, stale_after: float) -> list[Run]:
        """Make runs whose owner has not heartbeated for ``stale_after`` seconds claimable.

        A run whose cancel was requested becomes ``cancelled`` instead. Returns the runs
        changed, with their new status.
        """
        with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return [_run(r) for r in cur.execute(sql.STALE_SQL, (float(stale_after),)).fetchall()]

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
                    head = conn.execute(sql.STARTED_SQL, args)
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
                    conn.execute(sql.FINISH_LOCK_SQL, (run_id,))
                    cur = conn.cursor(row_factory=dict_row)
                    cur.execute(sql.FINISH_SQL, (status, output, error, run_id, owner))
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
                f"SELECT {sql.COLUMNS} FROM bulksync_runs WHERE run_id = %s FOR UPDATE", (run_id,)
            ).fetchone()
            if row is None:
                raise _unknown(run_id)
            before = str(row["status"])
            if before == PENDING:
                query = """UPDATE bulksync_runs SET status = 'cancelled', cancel_requested = true,
                    error = 'cancelled before it started', updated_at = now() WHERE run_id = %s"""
            elif before == RUNNING:
                query = """UPDATE bulksync_runs SET cancel_requested = true, updated_at = now()
                    WHERE run_id = %s"""
            else:
                return before, _run(row)
            cur.execute(query, (run_id,))
            after = cur.execute(
                f"SELECT {sql.COLUMNS} FROM bulksync_runs WHERE run_id = %s", (run_id,)
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
                f"SELECT {sql.COLUMNS} FROM bulksync_runs WHERE run_id = %s", (run_id,)
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
        query = f"SELECT {sql.COLUMNS} FROM bulksync_runs"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += f" ORDER BY seq DESC LIMIT {max(0, int(limit))} OFFSET {max(0, int(offset))}"

        def read(_: int) -> list[Run]:
            with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                return [_run(r) for r in cur.execute(query, params).fetchall()]

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
    """A run id and its start, from a row of ``sql.started_sql``."""
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
