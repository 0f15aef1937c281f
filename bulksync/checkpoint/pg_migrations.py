"""The Postgres schema of bulksync: one append-only list of migrations for the whole database.

The statements ``PostgresSaver`` runs live here too, below the migrations, so that a change
to a table and to the SQL that reads it is made in one file.

Every table bulksync keeps in Postgres is created here, whoever uses it, so a database has a
single history recorded in ``bulksync_migrations (version, applied_at)``::

    bulksync_checkpoints        one row per checkpoint: the record without channel values
                                (``serde.dumps_checkpoint``, bytea), its parent's id, metadata
                                (jsonb)
    bulksync_checkpoint_blobs   one row per (thread, ns, channel, version): the channel's value
                                (msgpack, bytea), written only when it changed; NULL = empty;
                                a delta (``appends.py``) holds what it appends to an older row
    bulksync_checkpoint_writes  pending writes keyed (thread, ns, checkpoint, task id, idx)
    bulksync_thread_leases      which coordinator drives a thread, until when, and the fencing
                                token its checkpoint commits are checked against
    bulksync_check_lease()      the check a fenced commit runs first (``FENCE_SQL``)
    bulksync_check_leases()     the same for the commits of several threads sent together
                                (``FENCE_TOGETHER_SQL``)
    bulksync_runs               detached runs: status, owner and heartbeat, payload and output
                                (``bulksync.service.runs``)
    bulksync_store              the store's items: namespace prefix, key, value (jsonb), times,
                                expiry (``bulksync.store.postgres``)

**Adding a migration** (for any module: the runs table too): append one SQL string at the end
of ``MIGRATIONS``, written out here (importing it from the module that uses the table would
make this module import that one). Its version is its position, counted from 1. Never edit,
reorder or remove an entry that has shipped: databases record versions, not text. A string
may hold several statements; each runs inside ``apply_migrations``'s transaction, so no
``CONCURRENTLY``.

Ids that ``list`` orders by are ``COLLATE "C"``: byte order, as in SQLite, whatever the
database's locale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import Connection
from psycopg.rows import tuple_row

LEASE_LOST_SQLSTATE = "BSL01"
"""Raised by ``bulksync_check_lease`` when the lease has another token (detail: that token)."""

MIGRATIONS: tuple[str, ...] = (
    # 1
    """CREATE TABLE bulksync_checkpoints (
        thread_id text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL DEFAULT '',
        checkpoint_id text COLLATE "C" NOT NULL,
        parent_checkpoint_id text COLLATE "C",
        checkpoint bytea NOT NULL,
        metadata jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    )""",
    # 2
    """CREATE TABLE bulksync_checkpoint_blobs (
        thread_id text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL DEFAULT '',
        channel text COLLATE "C" NOT NULL,
        version bigint NOT NULL,
        blob bytea,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
    )""",
    # 3
    """CREATE TABLE bulksync_checkpoint_writes (
        thread_id text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL DEFAULT '',
        checkpoint_id text COLLATE "C" NOT NULL,
        task_id text COLLATE "C" NOT NULL,
        idx integer NOT NULL,
        channel text NOT NULL,
        blob bytea NOT NULL,
        task_path text COLLATE "C" NOT NULL DEFAULT '',
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    )""",
    # 4: list(None) walks every thread newest first.
    """CREATE INDEX bulksync_checkpoints_by_id
        ON bulksync_checkpoints (checkpoint_id, thread_id, checkpoint_ns)""",
    # 5
    """CREATE TABLE bulksync_thread_leases (
        thread_id text PRIMARY KEY,
        owner text NOT NULL,
        token bigint NOT NULL,
        expires_at timestamptz NOT NULL
    )""",
    # 6: the fence of a checkpoint commit (see FENCE_SQL).
    f"""CREATE FUNCTION bulksync_check_lease(p_thread_id text, p_token bigint)
    RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        current_token bigint;
    BEGIN
        SELECT token INTO current_token FROM bulksync_thread_leases
            WHERE thread_id = p_thread_id FOR SHARE;
        IF current_token IS DISTINCT FROM p_token THEN
            RAISE EXCEPTION USING ERRCODE = '{LEASE_LOST_SQLSTATE}',
                MESSAGE = 'bulksync: the lease of thread ' || p_thread_id || ' moved on',
                DETAIL = coalesce(current_token::text, 'none');
        END IF;
    END $$""",
    # 7: detached runs (bulksync/service/runs.py documents the columns).
    """CREATE TABLE bulksync_runs (
        run_id text PRIMARY KEY,
        seq bigint GENERATED ALWAYS AS IDENTITY,
        thread_id text NOT NULL,
        graph_id text NOT NULL,
        kind text NOT NULL,
        status text NOT NULL DEFAULT 'pending' CHECK (status IN
            ('pending', 'running', 'interrupted', 'success', 'error', 'cancelled', 'timeout')),
        payload bytea NOT NULL,
        output bytea,
        error text,
        multitask_strategy text NOT NULL DEFAULT 'enqueue',
        owner text,
        heartbeat_at timestamptz,
        cancel_requested boolean NOT NULL DEFAULT false,
        attempts integer NOT NULL DEFAULT 0,
        start_checkpoint text,
        start_writes integer,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE INDEX bulksync_runs_pending ON bulksync_runs (seq) WHERE status = 'pending';
    CREATE INDEX bulksync_runs_running ON bulksync_runs (heartbeat_at) WHERE status = 'running';
    CREATE INDEX bulksync_runs_by_thread ON bulksync_runs (thread_id, seq)""",
    # 8: the store (bulksync.store.postgres); prefix: the namespace's labels joined by "."
    """CREATE TABLE bulksync_store (
        prefix text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        value jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        expires_at timestamptz,
        ttl_minutes double precision,
        PRIMARY KEY (prefix, key)
    );
    CREATE INDEX bulksync_store_prefix ON bulksync_store (prefix text_pattern_ops);
    CREATE INDEX bulksync_store_expires ON bulksync_store (expires_at)
        WHERE expires_at IS NOT NULL""",
    # 9: threads as the HTTP API names them (bulksync/service/threads.py documents the columns).
    """CREATE TABLE bulksync_threads (
        thread_id text PRIMARY KEY,
        graph_id text,
        metadata jsonb NOT NULL DEFAULT '{}',
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE INDEX bulksync_threads_by_update ON bulksync_threads (updated_at)""",
    # 10: the newest whole value of a channel at or below a version, in one probe: a read
    # fetches the chain of deltas above it as one range of versions (BLOBS_SQL).
    """CREATE INDEX bulksync_checkpoint_blobs_whole
        ON bulksync_checkpoint_blobs (thread_id, checkpoint_ns, channel, version)
        WHERE blob IS NULL OR get_byte(blob, 0) <> 193""",
    # 11: the fence of checkpoint commits of several threads in one transaction (see
    # FENCE_TOGETHER_SQL).
    f"""CREATE FUNCTION bulksync_check_leases(p_threads text[], p_tokens bigint[])
    RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        moved record;
    BEGIN
        PERFORM 1 FROM bulksync_thread_leases WHERE thread_id = ANY(p_threads)
            FOR SHARE NOWAIT;
        SELECT k.thread_id, l.token INTO moved
            FROM unnest(p_threads, p_tokens) AS k(thread_id, token)
            LEFT JOIN bulksync_thread_leases l ON l.thread_id = k.thread_id
            WHERE l.token IS DISTINCT FROM k.token LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '{LEASE_LOST_SQLSTATE}',
                MESSAGE = 'bulksync: the lease of thread ' || moved.thread_id || ' moved on',
                DETAIL = coalesce(moved.token::text, 'none');
        END IF;
    END $$""",
    # 12: the runs a claim just took, found again by the statements after it in its
    # transaction (runs_sql.CLAIMED) without reading every run the coordinator drives.
    """CREATE INDEX bulksync_runs_claimed ON bulksync_runs (owner, updated_at)
        WHERE status = 'running'""",
)
"""Schema steps, applied in order; append new ones, never edit or reorder (see above)."""

# The lock is per schema, so databases holding several bulksync schemas (tests) do not queue.
_LOCK_SQL = (
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "'bulksync_migrations:' || coalesce(current_schema(), ''), 0))"
)
_CREATE_HISTORY_SQL = """CREATE TABLE IF NOT EXISTS bulksync_migrations (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


def apply_migrations(conn: Connection[Any], migrations: Sequence[str] = MIGRATIONS) -> list[int]:
    """Apply the ``migrations`` the database lacks, in order; return the versions applied.

    One transaction holding an advisory lock: processes calling it at once apply each step
    exactly once, and a failing step leaves the database as it was (nothing recorded).
    """
    applied: list[int] = []
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_LOCK_SQL)
        cur.execute(_CREATE_HISTORY_SQL)
        done = {row[0] for row in cur.execute("SELECT version FROM bulksync_migrations")}
        for version, statement in enumerate(migrations, start=1):
            if version in done:
                continue
            cur.execute(statement)
            cur.execute(
                "INSERT INTO bulksync_migrations (version, applied_at) VALUES (%s, now())",
                (version,),
            )
            applied.append(version)
    return applied


# Statements PostgresSaver runs, next to the tables they touch.

ROW_COLUMNS = "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata"
# The inserts of a checkpoint commit, each as the INSERT before its rows, one row's
# placeholders, and what a conflict does: ``pg_commits.py`` sends the rows of a commit, of
# every table, in one statement.
PUT_BLOBS = (
    "INSERT INTO bulksync_checkpoint_blobs (thread_id, checkpoint_ns, channel, version, blob)",
    "(%s, %s, %s, %s, %s)",
    "ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET blob = EXCLUDED.blob",
)
PUT_CHECKPOINTS = (
    f"INSERT INTO bulksync_checkpoints ({ROW_COLUMNS})",
    "(%s, %s, %s, %s, %s, %s::jsonb)",
    """ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = EXCLUDED.parent_checkpoint_id,
    checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata""",
)
_PUT_WRITES = """INSERT INTO bulksync_checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, blob, task_path)"""
_WRITE_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s)"
_ON_WRITE = "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO "
KEEP_FIRST = (_PUT_WRITES, _WRITE_ROW, _ON_WRITE + "NOTHING")
KEEP_LAST = (
    _PUT_WRITES,
    _WRITE_ROW,
    _ON_WRITE
    + "UPDATE SET channel = EXCLUDED.channel, blob = EXCLUDED.blob, task_path = EXCLUDED.task_path",
)
# A channel's value at a version and, while it is a delta (bulksync.checkpoint.appends: 0xC1,
# then its base version in 8 big-endian bytes), the versions it extends, down to a whole value.
CHAIN_SQL = """WITH RECURSIVE chain(version, blob, base) AS (
        SELECT version, blob, CASE WHEN get_byte(blob, 0) = 193 THEN
            ('x' || encode(substring(blob FROM 2 FOR 8), 'hex'))::bit(64)::bigint END
        FROM bulksync_checkpoint_blobs
        WHERE thread_id = %(thread)s AND checkpoint_ns = %(ns)s AND channel = %(channel)s
          AND version = %(version)s
    UNION ALL
        SELECT b.version, b.blob, CASE WHEN get_byte(b.blob, 0) = 193 THEN
            ('x' || encode(substring(b.blob FROM 2 FOR 8), 'hex'))::bit(64)::bigint END
        FROM chain AS c JOIN bulksync_checkpoint_blobs AS b
          ON b.thread_id = %(thread)s AND b.checkpoint_ns = %(ns)s AND b.channel = %(channel)s
         AND b.version = c.base
    )
    SELECT version, blob FROM chain"""
# The stored versions a read of checkpoints needs, given each channel's version in each: from
# the newest whole value at or below that version up to it (a delta's chain is among those in
# a linear thread; the rest of a forked one's is fetched with CHAIN_SQL). The spans of one
# channel are read as one range, less the versions no span covers when there are several.
BLOBS_SQL = """WITH spans AS (
        SELECT k.thread_id, k.checkpoint_ns, k.channel, k.version AS hi, coalesce((
            SELECT max(w.version) FROM bulksync_checkpoint_blobs AS w
            WHERE w.thread_id = k.thread_id AND w.checkpoint_ns = k.checkpoint_ns
              AND w.channel = k.channel AND w.version <= k.version
              AND (w.blob IS NULL OR get_byte(w.blob, 0) <> 193)), k.version) AS lo
        FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[])
          AS k(thread_id, checkpoint_ns, channel, version)
    ), channels AS (
        SELECT thread_id, checkpoint_ns, channel, min(lo) AS lo, max(hi) AS hi, count(*) AS spans
        FROM spans GROUP BY thread_id, checkpoint_ns, channel
    )
    SELECT b.thread_id, b.checkpoint_ns, b.channel, b.version, b.blob
    FROM channels AS c JOIN bulksync_checkpoint_blobs AS b
      ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
     AND b.channel = c.channel AND b.version BETWEEN c.lo AND c.hi
    WHERE c.spans = 1 OR EXISTS (
        SELECT FROM spans AS s WHERE s.thread_id = b.thread_id
          AND s.checkpoint_ns = b.checkpoint_ns AND s.channel = b.channel
          AND b.version BETWEEN s.lo AND s.hi)"""
WRITES_SQL = """SELECT k.i, w.task_id, w.idx, w.channel, w.blob, w.task_path
    FROM unnest(%s::int[], %s::text[], %s::text[], %s::text[])
      AS k(i, thread_id, checkpoint_ns, checkpoint_id)
    JOIN bulksync_checkpoint_writes AS w
      ON w.thread_id = k.thread_id AND w.checkpoint_ns = k.checkpoint_ns
     AND w.checkpoint_id = k.checkpoint_id"""
KEYSET_SQL = " AND (checkpoint_id, thread_id, checkpoint_ns) < (%s, %s, %s)"
CHECKPOINT_TABLES = (
    "bulksync_checkpoints",
    "bulksync_checkpoint_blobs",
    "bulksync_checkpoint_writes",
)

# Locks the lease row FOR SHARE until the commit ends (a takeover waits for it) and raises
# LEASE_LOST_SQLSTATE unless the row carries the token: the commit's statements, sent in the
# same pipeline segment (one implicit transaction), are then rolled back with it.
FENCE_SQL = "SELECT bulksync_check_lease(%s, %s)"
# The same for the commits of several threads sent together (PostgresSaver's group commit),
# except that it never waits for a lease row another transaction holds (a renewal, a
# takeover): it fails at once, and each commit is sent again on its own. Waiting, while
# holding the other threads' rows, could close a cycle with a statement that updates
# several lease rows.
FENCE_TOGETHER_SQL = "SELECT bulksync_check_leases(%s::text[], %s::bigint[])"


# Token kept while the same owner holds a live lease; any change of hands (or a re-acquire
# after expiry or release) takes the next one.
def acquire_sql(leases: str) -> str:
    """Take the leases ``leases`` lists (``VALUES``, or a ``SELECT`` of thread id, owner, 1
    and the expiry) where each is free, expired or its owner's already; their tokens."""
    return f"""INSERT INTO bulksync_thread_leases AS l (thread_id, owner, token, expires_at)
    {leases}
    ON CONFLICT (thread_id) DO UPDATE SET
      token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                   THEN l.token ELSE l.token + 1 END,
      owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
    WHERE l.owner = EXCLUDED.owner OR l.expires_at <= now()
    RETURNING token"""


ACQUIRE_SQL = acquire_sql(
    "VALUES (%(thread)s, %(owner)s, 1, now() + make_interval(secs => %(ttl)s))"
)
RENEW_SQL = """UPDATE bulksync_thread_leases AS l
    SET expires_at = now() + make_interval(secs => %s)
    FROM unnest(%s::text[], %s::bigint[]) AS k(thread_id, token)
    WHERE l.thread_id = k.thread_id AND l.token = k.token AND l.owner = %s
    RETURNING l.thread_id"""
RELEASE_SQL = """UPDATE bulksync_thread_leases SET expires_at = '-infinity'
    WHERE thread_id = %s AND owner = %s AND token = %s"""


_NUMBER_SQL = (
    " AND (CASE jsonb_typeof(metadata -> %s::text)"
    " WHEN 'number' THEN (metadata ->> %s::text)::numeric"
    " WHEN 'boolean' THEN (metadata -> %s::text = 'true')::int END) = %s::numeric"
)


def metadata_where(filter: Mapping[str, Any] | None) -> tuple[str, list[Any], bool]:
    """SQL for the ``filter`` items jsonb can match exactly, and whether that was all of them.

    Matches what ``metadata_matches`` does in Python: ``None`` also matches a missing key,
    numbers and bools compare by value (``True == 1 == 1.0``), strings only equal strings.
    Lists, dicts and numbers a float cannot hold exactly are matched in Python after reading.
    """
    where, exact = "", True
    params: list[Any] = []
    for key, value in (filter or {}).items():
        if value is None:
            where += " AND coalesce(metadata -> %s::text, 'null') = 'null'"
            params.append(key)
        elif isinstance(value, str):
            where += " AND metadata -> %s::text = to_jsonb(%s::text)"
            params += [key, value]
        elif isinstance(value, bool | int | float) and abs(value) < 2**53:
            where += _NUMBER_SQL
            number = repr(float(value)) if isinstance(value, float) else str(int(value))
            params += [key, key, key, number]
        else:
            exact = False
    return where, params, exact
