"""A checkpoint commit sent now and confirmed later: Postgres commits while the loop plans.

A loop's step ends with its checkpoint's commit, and the next step may not start its tasks
before that commit is confirmed. Between the two the loop has work of its own — plan
the next step, build its messages — and Postgres has its own: run the statements, flush its
log. :class:`InFlight` lets them overlap on one thread: :meth:`InFlight.send` queues the
commit's statements in pipeline mode and sends them with their sync (the transaction's
end) without reading the answer; :meth:`InFlight.land` reads it, and raises its error.

psycopg's public ``Pipeline.sync`` sends and waits in one call; its two halves are the
pipeline's own steps (``_enqueue_sync``, ``_communicate_gen``, ``_fetch_gen``, ``_exit``).
:func:`supported` checks that the installed psycopg has them; where it does not, commits are
sent and confirmed in one call, as before (:func:`commit_soon`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from bulksync.checkpoint.pg_commits import Commit, queue_commits
from bulksync.rounds import Rounds

_log = logging.getLogger("bulksync.checkpoint")

_PIPELINE_STEPS = ("_enqueue_sync", "_communicate_gen", "_fetch_gen", "_exit")


def supported() -> bool:
    """Whether this psycopg's pipeline can be sent now and read later (module docstring)."""
    pipeline = getattr(psycopg, "Pipeline", None)
    return pipeline is not None and all(hasattr(pipeline, s) for s in _PIPELINE_STEPS)


_SPLIT = supported()


def commit_soon(
    pool: ConnectionPool[Any],
    rounds: Rounds[Commit],
    entry: Commit,
    commit: Callable[[Commit], None],
    commit_alone: Callable[[Commit], None],
) -> Callable[[], None] | None:
    """Send ``entry`` on a connection of ``pool`` when no other commit is on the wire, and
    return its confirmation; ``rounds`` are held until then, so other threads' commits wait
    and go together after it. A confirmation whose answer fails sends ``entry`` again with
    ``commit_alone`` (its retries, and its error). None: ``entry`` was committed here, by
    ``commit`` (with other threads' commits) or, when sending failed, ``commit_alone``.
    """
    if not (_SPLIT and rounds.take()):
        commit(entry)
        return None
    try:
        flight = InFlight.send(pool, [entry])
    except Exception as exc:
        rounds.give_back()
        _log.debug("sending %s failed (%s): sent again alone", entry.what, exc)
        commit_alone(entry)
        return None
    except BaseException:
        rounds.give_back()
        raise
    if flight is None:  # (a pool without autocommit)
        rounds.give_back()
        commit(entry)
        return None

    def confirm() -> None:
        failed: Exception | None = None
        try:
            flight.land()
        except Exception as exc:
            failed = exc
        finally:
            rounds.give_back()
        if failed is not None:
            _log.debug("committing %s failed (%s): sent again alone", entry.what, failed)
            commit_alone(entry)

    return confirm


class InFlight:
    """A commit sent on a pooled connection, its answer not read yet (the connection is
    held until :meth:`land`)."""

    def __init__(self, pool: ConnectionPool[Any], conn: psycopg.Connection[Any]) -> None:
        self._pool = pool
        self._conn = conn
        self._pipeline: Any = None

    @classmethod
    def send(cls, pool: ConnectionPool[Any], batch: Sequence[Commit]) -> InFlight | None:
        """Send the statements of ``batch`` and their sync on a connection of ``pool``; None
        (nothing sent) when that connection is not in autocommit mode: there the sync does
        not end the transaction, and the pool's ``connection()`` commits it.

        Raises:
            psycopg.Error: sending failed (the connection is closed and returned).
            psycopg_pool.PoolTimeout: no connection came within the pool's timeout.
        """
        flight = cls(pool, pool.getconn())
        conn = flight._conn
        if not conn.autocommit:
            pool.putconn(conn)
            return None
        try:
            with conn.lock:
                if conn._pipeline is not None:  # (a pooled connection is never in one)
                    raise psycopg.ProgrammingError("the connection is in pipeline mode")
                pipeline = flight._pipeline = conn._pipeline = psycopg.Pipeline(conn)
            pipeline.__enter__()
            queue_commits(conn.cursor(), batch)
            with conn.lock:
                pipeline._enqueue_sync()
                conn.wait(pipeline._communicate_gen())
        except BaseException:
            flight._give_back(failed=True)
            raise
        return flight

    def land(self) -> None:
        """Read the commit's answer; the connection goes back to the pool.

        Raises:
            psycopg.Error: the commit failed (nothing of it is stored), or its answer was lost
                with the connection (it may be stored or not: a retry stores it once).
        """
        conn, failed = self._conn, True
        try:
            with conn.lock:
                conn.wait(self._pipeline._fetch_gen(flush=False))
            failed = False
        finally:
            self._give_back(failed=failed)

    def _give_back(self, *, failed: bool) -> None:
        """Leave pipeline mode and return the connection; after a failure, closed (the pool
        replaces it): its pipeline may still hold results nobody will read."""
        conn, pipeline = self._conn, self._pipeline
        try:
            if pipeline is not None and not failed:
                pipeline._exit(None)
        except BaseException:
            failed = True
            raise
        finally:
            conn._pipeline = None
            if failed or pipeline is None:
                conn.close()
            self._pool.putconn(conn)
