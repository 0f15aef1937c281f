"""Opening a Postgres pool, and telling an outage from a bad call: what every bulksync
component on Postgres shares (the saver, the runs and threads tables, the store)."""

from __future__ import annotations

import math
from typing import Any, Final

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from bulksync.errors import ServiceUnavailableError
from bulksync.urls import redact

RETRY_WINDOW: Final = 60.0
"""Seconds a call is retried through an outage unless told otherwise (``retry_window``)."""

# SQLSTATE classes of a server that is gone or not ready: connection exceptions, operator
# intervention (shutdown, starting up), insufficient resources (too many connections).
_TRANSIENT_CLASSES: Final = ("08", "57", "53")


def is_transient_postgres(exc: BaseException) -> bool:
    """Whether ``exc`` says Postgres was unreachable for now (worth retrying), not a bad call."""
    if isinstance(exc, PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state[:2] in _TRANSIENT_CLASSES
    return False


def open_pool(
    url: str,
    *,
    max_size: int,
    connect_timeout: float,
    name: str = "bulksync-postgres",
    wait: float = 30.0,
) -> ConnectionPool[Any]:
    """An open pool of up to ``max_size`` autocommit connections to ``url``; a caller waits
    up to ``wait`` seconds for one.

    Raises:
        ServiceUnavailableError: ``url`` is malformed, or Postgres does not accept a
            connection within ``connect_timeout`` seconds (naming the URL, password hidden).
    """
    try:  # One plain connection first: it fails at once and says why (pools retry).
        psycopg.connect(url, connect_timeout=max(2, math.ceil(connect_timeout))).close()
    except psycopg.Error as exc:
        raise _unavailable(url, str(exc)) from exc
    pool: ConnectionPool[Any] = ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        open=False,
        name=name,
        timeout=wait,
    )
    try:
        pool.open(wait=True, timeout=connect_timeout)
    except PoolTimeout as exc:
        pool.close()
        raise _unavailable(url, f"no connection within {connect_timeout} s") from exc
    return pool


def _unavailable(url: str, reason: str) -> ServiceUnavailableError:
    reason = " ".join(reason.split())  # libpq's messages span lines; keep one
    end = "" if reason.endswith((".", "?", "!")) else "."
    return ServiceUnavailableError(
        f"Cannot connect to Postgres at {redact(url)}: {reason}{end} Check the URL "
        "(BULKSYNC_DATABASE_URL) and that the server is running and accepts connections."
    )
