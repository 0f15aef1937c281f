"""``PostgresSaver``: checkpoints in Postgres through a psycopg 3 pool, and the thread lease.

Tables, their migrations and the statements run against them are in ``pg_migrations.py``
(``setup()`` applies the migrations; it runs by itself on first use); how a commit queues
them, in ``pg_commits.py``. Storage follows ``SqliteSaver``: a blob row only for the channels
in ``new_versions`` (a (channel, version) put again is replaced: forks reuse versions); regular
writes keep the first value (``ON CONFLICT DO NOTHING``), special writes the last (upsert).
Many regular writes stored by one call share a few rows (``pg_packed.py``). ``list``
reads a page of checkpoints, then the page's blobs and writes in one pipelined round trip,
never one query per checkpoint (``pg_reads.py``).

Each call borrows a pooled connection. A write sends all its statements as one pipeline
segment, which Postgres runs as one transaction (committed at the segment's Sync on an
autocommit connection, as ``from_conn_string`` makes them; else when the pool takes the
connection back): a write is atomic and costs one round trip. Any failure rolls it all back.

**Group commit.** A coordinator commits the checkpoints of many runs, each from its own
thread. A commit made while another is on the wire waits for it, then goes with every other
that waited, in one transaction (``bulksync.rounds``; at most ``_TOGETHER`` threads): one
round trip, one log flush, and less CPU per commit on both ends. A lone commit goes at once.
A round is tried once, so no caller waits on another's retries. A shared transaction checks
every fence first with one statement that never waits for a lease row
(``FENCE_TOGETHER_SQL``). If anything in a round fails (a lease moved on, a row held, an
outage), nothing of it is stored, and each of its commits is sent again alone, with its own
fence, retries and errors, exactly as without company.

**Sent now, confirmed later.** A loop commits each step with ``put_steps_soon`` and plans
its next step while Postgres commits (``pg_flight.py``); the commit is confirmed before the
step's tasks can start. While it is unconfirmed, it counts as the round on the wire: other
threads' commits wait for it, then go together.

Metadata is jsonb: ``list(filter=...)`` matches strings, ``None`` and numbers/bools (by value,
like Python's ``==``) in SQL; lists, dicts and numbers beyond 2**53 are matched in Python after
reading. jsonb keeps numbers as ``numeric``, so a float written in exponent form (``1e+23``)
reads back as an int, and it cannot hold NUL characters: such metadata is refused.

**Lease and fencing.** ``bulksync_thread_leases`` has one row per thread: its owner, expiry
and a fencing token that grows by one each time the lease changes hands. Rows are never
deleted (not even by ``delete_thread``), so a token is never handed out twice. A view from
``fenced(thread, token)`` commits checkpoints of that thread only while the lease row still
carries ``token``: ``bulksync_check_lease`` locks the row ``FOR SHARE`` in the commit's own
transaction, so a takeover waits for a commit in flight (and its new owner reads it), and
raises when the token moved on, so a commit after a takeover writes nothing. Expiry alone
refuses nothing; only a newer token does.

**Outages.** Every call is retried with backoff (``bulksync.retry``) while it fails because
Postgres is unreachable — a restart, a dropped connection, no pooled connection within the
pool's timeout — for up to ``retry_window`` seconds (the setting of that name), then the last
error is raised. Each call is safe to run twice: reads; ``put`` of a checkpoint by its id (an
upsert) whose retried transaction checks the fence again, so a commit after a takeover is
still refused; ``put_writes`` (first write wins, special writes set the same value again);
the lease statements (re-acquiring one's own live lease keeps its token). A broken pooled
connection is dropped by the pool when given back, and the retry takes a fresh one.

``put_writes`` is not fenced: writes hang off a checkpoint already committed and are keyed by
deterministic task ids, and regular ones keep the first value, so a stale coordinator can only
record a result that task really produced from that checkpoint, which any owner would accept.
Only ``put`` moves a thread forward, so only ``put`` could fork its chain.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from bulksync.checkpoint import pg_migrations as pgm
from bulksync.checkpoint.async_methods import AsyncSaverMethods
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointTuple,
    Serde,
    Step,
    TaskWrites,
    blob_rows,
    checkpoint_config,
    config_thread,
    keyset_pages,
    list_where,
    write_rows,
)
from bulksync.checkpoint.pg_commits import Commit, Queued, queue_commits, queue_writes
from bulksync.checkpoint.pg_flight import commit_soon
from bulksync.checkpoint.pg_migrations import MIGRATIONS, apply_migrations
from bulksync.checkpoint.pg_packed import packed
from bulksync.checkpoint.pg_pool import RETRY_WINDOW, is_transient_postgres, open_pool
from bulksync.checkpoint.pg_reads import read_page, reading
from bulksync.checkpoint.serde import (
    MsgpackSerde,
    dumps_checkpoint,
    dumps_metadata,
)
from bulksync.errors import (
    ConfigError,
    LeaseLostError,
    SerializationError,
)
from bulksync.retry import retry
from bulksync.rounds import Rounds

T = TypeVar("T")

_log = logging.getLogger("bulksync.checkpoint")

__all__ = [
    "MIGRATIONS",
    "PAGE_SIZE",
    "PostgresSaver",
    "apply_migrations",
]

PAGE_SIZE = 100
"""Checkpoints ``list`` reads per round of queries."""

_TOGETHER = 32
"""At most this many threads' commits share one transaction."""


@dataclasses.dataclass
class _Shared:
    """What a saver shares with its fenced views: whether migrations ran, and the rounds
    its checkpoint commits are sent in."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    done: bool = False
    commits: Rounds[Commit] = dataclasses.field(default_factory=lambda: Rounds(_TOGETHER))


class PostgresSaver(AsyncSaverMethods):
    """A ``CheckpointSaver`` storing threads in Postgres, with per-thread leases."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        serde: Serde | None = None,
        retry_window: float = RETRY_WINDOW,
    ) -> None:
        self.pool = pool
        self.serde: Serde = serde if serde is not None else MsgpackSerde()
        self.retry_window = retry_window
        self._shared = _Shared()
        self._fence: tuple[str, int] | None = None
        self._no_head: str | None = None  # a fenced view's thread known to have no checkpoint

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        url: str,
        *,
        max_size: int = 10,
        serde: Serde | None = None,
        connect_timeout: float = 10.0,
        retry_window: float = RETRY_WINDOW,
        pool_wait: float = 30.0,
    ) -> Iterator[PostgresSaver]:
        """Open a pool of up to ``max_size`` connections for the ``with`` block, then close it.

        Calls through an outage are retried for ``retry_window`` seconds; opening is not: a
        Postgres that cannot be reached now fails at once. A call waits up to ``pool_wait``
        seconds for a connection of the pool (``PoolTimeout`` then).

        Raises:
            ServiceUnavailableError: when ``url`` is malformed or Postgres does not accept a
                connection within ``connect_timeout`` seconds.
        """
        pool = open_pool(url, max_size=max_size, connect_timeout=connect_timeout, wait=pool_wait)
        try:
            yield cls(pool, serde=serde, retry_window=retry_window)
        finally:
            pool.close()

    def setup(self) -> None:
        """Apply the migrations this database lacks; runs by itself on first use."""

        def apply() -> None:
            with self._shared.lock, self.pool.connection() as conn:
                pgm.apply_migrations(conn, pgm.MIGRATIONS)
                self._shared.done = True

        self._retry(apply, "applying migrations")

    def fenced(self, thread_id: str, token: int, *, empty: bool = False) -> PostgresSaver:
        """A view on the same pool whose ``put`` for ``thread_id`` needs the lease's ``token``.

        Its ``put`` raises ``LeaseLostError`` and writes nothing once the lease carries
        another token; other threads and the other methods behave as on this saver.
        ``empty``: the lease was taken on a thread without a root checkpoint (as read with
        it), so the view answers that the thread has no head without asking Postgres — until
        its first ``put`` to the thread. The lease keeps other coordinators from committing
        to the thread meanwhile.
        """
        view = copy.copy(self)
        view._fence = (thread_id, token)
        view._no_head = thread_id if empty else None
        return view

    def get_tuple(self, config: Mapping[str, Any]) -> CheckpointTuple | None:
        """The checkpoint named by ``configurable.checkpoint_id``, else the thread's latest."""
        if self._no_head is not None and _asks_head_of(config, self._no_head):
            return None  # known to have none
        where, params = list_where(config, None, "%s")
        sql = f"SELECT {pgm.ROW_COLUMNS} FROM bulksync_checkpoints WHERE {where}"
        found = self._read_page(sql + " ORDER BY checkpoint_id DESC LIMIT 1", params)
        return found[0] if found else None

    def list(
        self,
        config: Mapping[str, Any] | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first; ``filter`` matches metadata keys, ``before`` a checkpoint id.

        ``config`` names the thread, optionally a namespace (without one: all of the
        thread's) and one checkpoint; ``None`` lists every thread and namespace.
        """
        where, params = list_where(config, before, "%s", listing=True)
        filter_sql, filter_params, exact = pgm.metadata_where(filter)
        where, params = where + filter_sql, params + filter_params
        order = "ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC"

        def read(size: int, after: builtins.list[Any]) -> builtins.list[CheckpointTuple]:
            keyset = pgm.KEYSET_SQL if after else ""
            sql = f"SELECT {pgm.ROW_COLUMNS} FROM bulksync_checkpoints WHERE {where}{keyset}"
            return self._read_page(f"{sql} {order} LIMIT {size}", [*params, *after])

        yield from keyset_pages(read, filter=filter, exact=exact, limit=limit, page_size=PAGE_SIZE)

    def put(
        self,
        config: Mapping[str, Any],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """Store ``checkpoint`` as the child of ``config``'s checkpoint; return its config.

        Only channels in ``new_versions`` get a blob row; the others are read from the row
        written when their current version was.

        Raises:
            LeaseLostError: on a ``fenced`` view, when another coordinator took the thread.
        """
        return self.put_step(config, (), checkpoint, metadata, new_versions)

    def put_step(
        self,
        config: Mapping[str, Any],
        batch: Sequence[TaskWrites],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """``put_writes_batch(config, batch)`` then ``put(config, checkpoint, ...)``, in one
        transaction: a step's last results and the checkpoint they make, one round trip.

        Raises:
            LeaseLostError: on a ``fenced`` view, when another coordinator took the thread
                (nothing is stored, the writes neither).
        """
        return self.put_steps([(config, batch, checkpoint, metadata, new_versions)])[0]

    def put_steps(self, steps: Sequence[Step]) -> builtins.list[dict[str, Any]]:
        """``put_step`` of each of ``steps`` in order, all in one transaction and one round
        trip (each step's config names the checkpoint of the step before, or the head);
        their configs. Commits of other threads made meanwhile may share that transaction
        (group commit, module docstring).

        Raises:
            LeaseLostError: on a ``fenced`` view, when another coordinator took the thread
                (nothing is stored).
        """
        entry, configs = self._commit_entry(steps)
        self._commit(entry)
        return configs

    def put_steps_soon(
        self, steps: Sequence[Step]
    ) -> tuple[builtins.list[dict[str, Any]], Callable[[], None] | None]:
        """``put_steps``, sent now and confirmed by the callable returned (None: confirmed
        already), which raises what ``put_steps`` would. Meanwhile the caller may do its own
        work, nothing that assumes the checkpoints stored, nor wait on anything (other
        threads' commits wait for the confirmation: ``pg_flight.py``). Sent on its own when
        no other commit is on the wire; else with the others, confirmed at once.

        Raises:
            SerializationError: a value that cannot be stored (nothing is sent).
        """
        entry, configs = self._commit_entry(steps)
        if not self._shared.done:  # (the first commit applies the migrations)
            self._commit(entry)
            return configs, None
        rounds = self._shared.commits
        return configs, commit_soon(self.pool, rounds, entry, self._commit, self._commit_alone)

    def _commit_entry(self, steps: Sequence[Step]) -> tuple[Commit, builtins.list[dict[str, Any]]]:
        """The commit storing ``steps`` (encoded here), and the configs of their checkpoints."""
        thread_id = config_thread(steps[0][0])[0]
        if thread_id == self._no_head:
            self._no_head = None  # the thread has a head from now on
        queued: builtins.list[Queued] = []
        configs: builtins.list[dict[str, Any]] = []
        for config, batch, checkpoint, metadata, new_versions in steps:
            thread, ns, parent_id = config_thread(config)
            assert thread == thread_id, "put_steps stores the steps of one thread"
            record = dumps_checkpoint(self.serde, checkpoint)
            queued.append(
                (
                    self._write_rows(config, batch),
                    blob_rows(self.serde, thread, ns, checkpoint, new_versions),
                    (thread, ns, checkpoint.id, parent_id, record, _metadata_json(metadata)),
                )
            )
            configs.append(checkpoint_config(thread, ns, checkpoint.id))
        token = self._fence[1] if self._fence and self._fence[0] == thread_id else None
        ids = ", ".join(step[2].id for step in steps)
        entry = Commit(thread_id, token, queued, f"checkpoint {ids} of thread {thread_id}")
        return entry, configs

    def _commit(self, entry: Commit) -> None:
        """Commit ``entry`` in the next round, with other threads' commits that wait."""
        self._shared.commits.join(entry, self._commit_round)
        if entry.alone:  # its round failed: on its own now, with retries and its own error
            self._commit_alone(entry)

    def _commit_round(self, batch: builtins.list[Commit]) -> None:
        """Commit ``batch`` in one transaction, tried once; if that fails, each of its
        commits is sent again alone, by its own caller (``_commit_alone``)."""
        try:
            self._commit_once(batch)
        except BaseException as exc:
            for entry in batch:  # (even when this thread is interrupted: the others go on)
                entry.alone = True
            if not isinstance(exc, Exception):
                raise
            _log.debug("a round of %d checkpoint commits failed (%s)", len(batch), exc)

    def _commit_alone(self, entry: Commit) -> None:
        """``entry`` alone, retried through an outage; its fence checked each time.

        Raises:
            LeaseLostError: its thread's lease moved on (nothing is stored).
        """
        thread_id, token = entry.thread_id, entry.token

        def commit() -> None:
            try:
                self._commit_once([entry])
            except psycopg.Error as exc:
                if token is None or exc.sqlstate != pgm.LEASE_LOST_SQLSTATE:
                    raise
                raise _lease_lost(thread_id, token, exc.diag.message_detail) from None

        self._retry(commit, f"committing {entry.what}")

    def _commit_once(self, batch: Sequence[Commit]) -> None:
        """The commits of ``batch`` in one transaction (``pg_commits.queue_commits``)."""
        with self._connection() as conn, conn.pipeline():
            queue_commits(conn.cursor(), batch)

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes: regular slots keep the first value, special slots the last."""
        self.put_writes_batch(config, [(writes, task_id, task_path)])

    def put_writes_batch(self, config: Mapping[str, Any], batch: Sequence[TaskWrites]) -> None:
        """``put_writes`` for several tasks of one checkpoint, in one transaction."""
        rows = self._write_rows(config, batch)
        if not rows:
            return

        def store() -> None:
            with self._connection() as conn, conn.pipeline():
                queue_writes(conn.cursor(), rows)

        more = f" and {len(batch) - 1} more" if len(batch) > 1 else ""
        self._retry(store, f"storing the writes of task {batch[0][1]}{more}")

    def _write_rows(
        self, config: Mapping[str, Any], batch: Sequence[TaskWrites]
    ) -> builtins.list[tuple[Any, ...]]:
        """The rows of ``batch``'s writes, by task and slot: every writer locks alike."""
        serde = self.serde
        rows = packed([r for w, t, p in batch for r in write_rows(serde, config, w, t, p)])
        rows.sort(key=lambda r: (r[3], r[4]))
        return rows

    def delete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint and write of ``thread_id``, in every namespace.

        The thread's lease row stays, so its fencing tokens keep growing.
        """

        def delete() -> None:
            with self._connection() as conn, conn.pipeline():
                for table in pgm.CHECKPOINT_TABLES:
                    conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread_id,))

        self._retry(delete, f"deleting thread {thread_id}")

    def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> int | None:
        """Hold ``thread_id`` for ``ttl`` seconds; its fencing token, or None if taken.

        Succeeds when the lease is free, expired or already ``owner``'s: a live holder
        re-acquiring keeps its token and extends the expiry; otherwise the token grows by one.
        One statement, so concurrent callers cannot both win.
        """
        args = {"thread": thread_id, "owner": owner, "ttl": _seconds(ttl)}
        # Retrying is safe: if the first attempt won, the retry finds the lease live and
        # ``owner``'s, and keeps its token.
        row = self._retry(lambda: self._fetch_one(pgm.ACQUIRE_SQL, args), "acquiring a lease")
        return None if row is None else int(row[0])

    def renew_leases(self, owner: str, leases: Mapping[str, int], ttl: float) -> set[str]:
        """Extend ``owner``'s leases (a token by thread id) to ``ttl`` seconds from now, in
        one statement; the threads renewed, without those whose token is no longer the
        lease's."""
        seconds = _seconds(ttl)
        if not leases:
            return set()
        args = (seconds, list(leases), list(leases.values()), owner)

        def renew() -> set[str]:
            with self._connection() as conn:
                rows = conn.cursor(row_factory=tuple_row).execute(pgm.RENEW_SQL, args)
                return {str(row[0]) for row in rows.fetchall()}

        return self._retry(renew, f"renewing {len(leases)} lease(s)")

    def release_lease(self, thread_id: str, owner: str, token: int) -> None:
        """End the lease now if ``owner`` still holds it with ``token``; the next acquire of
        the thread, by anyone, gets a new token.
        """
        self._retry(
            lambda: self._fetch_one(pgm.RELEASE_SQL, (thread_id, owner, token), rows=False),
            "releasing a lease",
        )

    def _retry(self, call: Callable[[], T], what: str) -> T:
        """``call()``, retried while Postgres is unreachable, for ``retry_window`` seconds."""
        return retry(
            call,
            transient=is_transient_postgres,
            window=self.retry_window,
            what=f"Postgres: {what}",
        )

    def _fetch_one(self, sql: str, args: Any, *, rows: bool = True) -> tuple[Any, ...] | None:
        """Run one statement; its first row (``rows=False``: a statement returning none)."""
        with self._connection() as conn:
            cur = conn.cursor(row_factory=tuple_row).execute(sql, args)
            return cur.fetchone() if rows else None

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        state = self._shared
        if not state.done:
            with state.lock, self.pool.connection() as conn:
                if not state.done:
                    pgm.apply_migrations(conn, pgm.MIGRATIONS)
                    state.done = True
        with self.pool.connection() as conn:
            yield conn

    def _read_page(self, sql: str, params: Sequence[Any]) -> builtins.list[CheckpointTuple]:
        """Checkpoints selected by ``sql`` (``pgm.ROW_COLUMNS``), with their blobs and writes."""
        return self._retry(
            lambda: read_page(self._connection, self.serde, self._versions, sql, params),
            "reading checkpoints",
        )

    def _versions(
        self, thread_id: str, ns: str, channel: str, version: int
    ) -> dict[int, bytes | None]:
        """``version`` of ``channel`` and the versions its chain of deltas goes back through,
        followed in the database (``pgm.CHAIN_SQL``): one query, only the rows needed."""
        args = {"thread": thread_id, "ns": ns, "channel": channel, "version": version}

        def read() -> dict[int, bytes | None]:
            with self._connection() as conn:
                return dict(reading(conn).execute(pgm.CHAIN_SQL, args).fetchall())

        return self._retry(read, f"reading the versions of channel {channel!r}")


def _lease_lost(thread_id: str, token: int, current: str | None) -> LeaseLostError:
    now = "no lease row at all" if current in (None, "none") else f"fencing token {current}"
    return LeaseLostError(
        f"Cannot commit a checkpoint of thread '{thread_id}': another coordinator took it over "
        f"(the lease has {now}, this coordinator holds token {token}). Nothing was written; "
        "stop driving this thread, its current lease holder continues from its last checkpoint."
    )


# An escaped NUL in JSON text: "\u0000" after an even number of backslashes.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _asks_head_of(config: Mapping[str, Any], thread_id: str) -> bool:
    """Whether ``config`` names the root head of ``thread_id``: no namespace, no id."""
    named = (config.get("configurable") or {}).get("thread_id") is not None
    return named and config_thread(config) == (thread_id, "", None)


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    """``dumps_metadata``, refusing what jsonb cannot hold (NUL characters)."""
    text = dumps_metadata(metadata)
    if _JSON_NUL.search(text):
        raise SerializationError(
            "Cannot store checkpoint metadata containing a NUL character ('\\x00'): Postgres "
            "jsonb cannot hold it. Remove or replace it in the metadata's keys and strings."
        )
    return text


def _seconds(ttl: float) -> float:
    """A lease ``ttl`` checked to be a positive, finite number of seconds."""
    if not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
        raise ConfigError(f"A lease ttl must be a positive number of seconds, got {ttl!r}.")
    return float(ttl)
