"""The SQL of the runs table; ``runs.py`` documents its columns and runs the statements.

A thread's advisory lock (``THREAD_LOCK``) orders a submission to the thread and the end of
its writer run against each other.
"""

from __future__ import annotations

from bulksync.checkpoint import pg_migrations as pgm

COLUMNS = (
    "run_id, thread_id, graph_id, kind, status, payload, output, error, multitask_strategy, "
    "owner, heartbeat_at, cancel_requested, attempts, start_checkpoint, start_writes, "
    "created_at, updated_at"
)
READS = "('get_state', 'get_state_history')"
# Per thread, so two submissions to one thread cannot both see it idle ("reject").
THREAD_LOCK = (
    "pg_advisory_xact_lock(hashtextextended("
    "'bulksync_runs:' || coalesce(current_schema(), '') || ':' || {thread}, 0))"
)
THREAD_LOCK_SQL = "SELECT " + THREAD_LOCK.format(thread="%s")

# Under the thread's lock (taken by the statement before, in the same transaction): the
# thread's graph and its active writer run (looked for only when the strategy refuses a
# busy thread), and the new run, inserted only when neither refuses it. A writer run
# binds its thread to its graph if nothing did yet (the ``bulksync_threads`` table, which
# ``threads.py`` reads). "" is a read across threads (a history without a thread): bound
# to no graph.
CREATE_SQL = f"""WITH bound AS (
        SELECT graph_id FROM bulksync_threads WHERE thread_id = %(thread)s
        AND %(thread)s <> ''),
    active AS (
        SELECT run_id, status FROM bulksync_runs WHERE %(refuse_busy)s
        AND thread_id = %(thread)s AND status IN ('pending', 'running')
        AND kind NOT IN {READS} ORDER BY seq LIMIT 1),
    inserted AS (
        INSERT INTO bulksync_runs (run_id, thread_id, graph_id, kind, payload,
            multitask_strategy)
        SELECT %(run)s, %(thread)s, %(graph)s, %(kind)s, %(payload)s, %(strategy)s
        WHERE NOT EXISTS (SELECT 1 FROM bound WHERE graph_id <> %(graph)s)
        AND NOT EXISTS (SELECT 1 FROM active)
        RETURNING {COLUMNS}),
    touched AS (
        INSERT INTO bulksync_threads (thread_id, graph_id)
        SELECT thread_id, graph_id FROM inserted WHERE kind NOT IN {READS}
        ON CONFLICT (thread_id) DO UPDATE SET updated_at = clock_timestamp(),
        graph_id = coalesce(bulksync_threads.graph_id, EXCLUDED.graph_id))
    SELECT inserted.*, (SELECT graph_id FROM bound) AS bound_graph,
        active.run_id AS active_run, active.status AS active_status
    FROM (SELECT 1) AS one LEFT JOIN inserted ON true LEFT JOIN active ON true"""
# Oldest first; a writer only when no writer of its thread runs or waits ahead of it.
# SKIP LOCKED: coordinators claiming at once take different runs instead of queueing.
# The look for such a writer names both statuses, so that only the thread index can serve
# it: written as "a pending run with a lower seq", the planner may take the pending runs'
# index for it, and when the table's statistics lag (a burst of runs into a young table, no
# ANALYZE yet) scan every pending run for each pending run: 173 ms a claim at 1,000 pending
# runs, 1.4 s at 3,000 (12 and 20 ms this way).
CLAIM_SQL = f"""WITH picked AS (
    SELECT r.run_id FROM bulksync_runs r
    WHERE r.status = 'pending' AND r.graph_id = ANY(%(graphs)s) AND (r.kind IN {READS} OR
        NOT EXISTS (SELECT 1 FROM bulksync_runs a WHERE a.thread_id = r.thread_id
                    AND a.kind NOT IN {READS} AND a.status IN ('pending', 'running')
                    AND (a.status = 'running' OR a.seq < r.seq)))
    ORDER BY r.seq LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED)
UPDATE bulksync_runs r SET status = 'running', owner = %(owner)s, heartbeat_at = now(),
    updated_at = now(), attempts = r.attempts + 1
    FROM picked WHERE r.run_id = picked.run_id
    RETURNING {", ".join(f"r.{c.strip()}" for c in COLUMNS.split(","))}"""
HEARTBEAT_SQL = """UPDATE bulksync_runs SET heartbeat_at = now()
    WHERE owner = %s AND status = 'running' AND run_id = ANY(%s) RETURNING run_id"""
STALE_SQL = f"""UPDATE bulksync_runs SET
    status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END,
    error = CASE WHEN cancel_requested THEN 'cancelled while its coordinator was lost'
                 ELSE error END,
    owner = NULL, heartbeat_at = NULL, updated_at = now()
    WHERE status = 'running' AND heartbeat_at < now() - make_interval(secs => %s)
    RETURNING {COLUMNS}"""
# The runs a claim takes, selected again by the statements after it in its transaction:
# now() is the transaction's start, the same in each of them, and no other transaction
# can have set it as this owner's running runs' updated_at. An index holds exactly these
# columns (migration 12): a claim costs no more with a thousand runs in flight than with none.
CLAIMED = f"""r.owner = %(owner)s AND r.status = 'running' AND r.updated_at = now()
    AND r.kind NOT IN {READS}"""
LEASE_CLAIMED_SQL = pgm.acquire_sql(
    f"""SELECT DISTINCT r.thread_id, %(owner)s, 1, now() + make_interval(secs => %(ttl)s)
    FROM bulksync_runs r WHERE {CLAIMED} ORDER BY 1"""
)


def started_sql(runs: str) -> str:
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


STARTED_SQL = started_sql("r.run_id = %(run)s")
STARTED_CLAIMED_SQL = started_sql(CLAIMED)

# The run's thread's lock first (as a submission takes it): a writer run queued behind this
# one either is seen by the statement after, or is inserted once this end is committed.
FINISH_LOCK_SQL = f"""SELECT {THREAD_LOCK.format(thread="thread_id")}
    FROM bulksync_runs WHERE run_id = %s AND kind NOT IN {READS}"""
FINISH_SQL = f"""UPDATE bulksync_runs r SET status = %s, output = %s, error = %s,
    updated_at = now() WHERE run_id = %s AND owner = %s AND status = 'running'
    RETURNING {COLUMNS}, r.kind NOT IN {READS} AND EXISTS (SELECT 1 FROM bulksync_runs q
        WHERE q.thread_id = r.thread_id AND q.status = 'pending'
        AND q.kind NOT IN {READS}) AS queued"""
