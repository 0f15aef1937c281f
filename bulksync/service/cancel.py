"""Cancelling a run on the cluster, from any process that reaches its Redis.

A cancel marker tells workers to skip the run's tasks that have not started; a ``CANCEL``
entry for each live step, in its gatherer's inbox, wakes that gatherer, which revokes and
delivers the unfinished tasks as cancelled. Neither needs Celery, so a client can cancel without it.
"""

from __future__ import annotations

import redis

from bulksync import keys
from bulksync.settings import Settings
from bulksync.workers import wire


def cancel_run(client: redis.Redis, run_id: str, settings: Settings) -> None:
    """Cancel ``run_id`` on the cluster: workers skip its tasks, its live steps stop.

    The marker lives ``settings.run_ttl`` seconds; a woken inbox ``settings.step_ttl``.
    """
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.cancel(run_id), b"1", ex=settings.run_ttl)
    pipe.smembers(keys.run_steps(run_id))
    steps = pipe.execute()[1]
    if steps:
        pipe = client.pipeline(transaction=False)
        for step in sorted(s.decode() for s in steps):
            wire.report(pipe, step, wire.CANCEL)
            pipe.expire(keys.inbox(step), settings.step_ttl)
        pipe.execute()
