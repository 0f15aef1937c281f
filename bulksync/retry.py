"""Riding through a service outage: calls retried with backoff, and Redis pools that wait.

A Redis or Postgres call that failed because the service was briefly unreachable (a restart,
a failover, a dropped connection, every pooled connection busy) is retried by
:func:`retry` with exponential backoff for up to a *window* of seconds (the ``retry_window``
setting), then its last error is raised. Only calls that are safe to run twice are wrapped:
reads, idempotent writes (a checkpoint put by id, first-write-wins task writes, a fenced
commit whose fence is checked again in the retried transaction), and Redis commands whose
repetition changes nothing that matters.

:func:`redis_client` builds a client whose pool *waits* for a free connection instead of
raising ``MaxConnectionsError`` when all are in use, so a process's own load never fails a
run; its size is a setting. Its calls take the lean way (``redis_lean.py``).

This module sits at the bottom of the layers: it knows no settings, callers pass numbers.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar

import redis

from bulksync.redis_lean import LeanRedis

T = TypeVar("T")

FIRST_WAIT: Final = 0.1
"""Seconds before the first retry; each retry waits twice as long as the one before."""

MAX_WAIT: Final = 2.0
"""Longest pause between two attempts, so a service that is back is used soon."""

POOL_WAIT: Final = 30.0
"""Longest wait for a free pooled Redis connection before the call fails (and is retried)."""

_log = logging.getLogger("bulksync.retry")


def is_transient_redis(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis was unreachable for now (worth retrying), not a bad call.

    Connection and timeout errors cover a restart, a dropped socket and a pool with no free
    connection; ``BusyLoadingError`` (a restarted Redis loading its data) is a connection error.
    """
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError)


def is_unknown_command(exc: redis.ResponseError) -> bool:
    """Whether Redis refused a command it does not have (``BLMPOP`` before Redis 7)."""
    return "unknown command" in str(exc).lower()


def retry(
    call: Callable[[], T],
    *,
    transient: Callable[[BaseException], bool],
    window: float,
    what: str,
    stop: threading.Event | None = None,
    logger: logging.Logger = _log,
) -> T:
    """``call()``, retried with backoff while it fails with a ``transient`` error.

    Gives up, raising the last error, once ``window`` seconds have passed since the first
    attempt, or at once when ``stop`` is set. ``what`` names the operation in the log.
    """
    deadline = time.monotonic() + window
    wait = FIRST_WAIT
    attempt = 1
    while True:
        try:
            return call()
        except Exception as exc:
            left = deadline - time.monotonic()
            if not transient(exc) or left <= 0 or (stop is not None and stop.is_set()):
                raise
            pause = min(wait * (0.5 + random.random()), left)  # jitter: retries don't align
            logger.warning(
                "%s failed (%s: %s); attempt %d, retrying in %.2f s for up to %.0f s more",
                what,
                type(exc).__name__,
                exc,
                attempt,
                pause,
                left,
            )
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)
            wait = min(MAX_WAIT, wait * 2)
            attempt += 1


def redis_client(url: str, max_connections: int) -> redis.Redis:
    """A client for ``url`` whose pool holds up to ``max_connections`` connections.

    A call that finds them all busy waits for one (up to ``POOL_WAIT`` s, then a
    ``ConnectionError``, which :func:`is_transient_redis` counts as transient). The client
    owns its pool: ``close()`` closes every connection of it (a client merely given a pool
    leaves them open until garbage collection).
    """
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=POOL_WAIT
    )
    return LeanRedis.from_pool(pool)
