"""The cluster executor: a step's tasks as Celery messages, their results gathered from Redis.

``submit`` puts the step into Redis once (the claim check: one hash with the shared state
and each task's input), publishes the tasks — a node's small Send tasks several per message;
into a Redis broker in the same round trip, else through Celery (``publish.py``) — and hands
the step to the executor's one gatherer (``gatherer.py``), which blocks on the one inbox the
workers of all its steps report to (``BLMPOP`` on one key; no polling, no connection held per
step) and delivers results and custom events in arrival order. Tasks that already have a
recorded result (a coordinator restarted mid-step) are delivered from Redis instead of running
again. Storing the step is retried through a Redis outage of up to ``retry_window`` seconds.
Each dispatched step is a ``CeleryStep`` (``step.py``).

A task that runs longer than the executor's task time limit (``default_timeout``, else the
``task_timeout`` setting; counted from when a worker starts it, not while it waits in a queue)
is delivered as ``TaskTimeoutError`` and its message revoked; the worker's hard time limit
stops it. This is the backstop for any node, sync ones included: an async node's own
``timeout=`` is kept by the worker that runs it (``workers/timeouts.py``).
Cancelling a run (``service.cancel.cancel_run``) wakes every live step of the run: their
unfinished tasks are delivered as ``TaskCancelledError`` and revoked, and workers skip the
run's remaining tasks. A cancelled step (or run) also stops its tasks already running: the
workers' ``stopper.py`` cancels their async nodes, and the coordinator waits for them as it
does in-process. If Redis restarts or loses the step's keys, the gatherer waits for it to
come back and dispatches the step's unfinished tasks again (results that survived count).
A task whose worker died (its claim expired: ``claims.py``) or that was never started within
``unstarted_grace`` is published again; one whose worker died ``max_deliveries`` times fails
with ``WorkerLostError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery

from bulksync.coordinator.executor import StepHandle, StepInput, StepLive, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import UnknownGraphError
from bulksync.retry import redis_client
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.gatherer import Gatherer
from bulksync.workers.celery.outbox import Outbox
from bulksync.workers.celery.publish import DirectPublisher
from bulksync.workers.celery.step import CeleryStep
from bulksync.workers.execute import run_task
from bulksync.workers.registry import walk_specs

log = logging.getLogger(__name__)


class CeleryExecutor:
    """Runs each step's tasks on Celery workers that loaded the same graph.

    ``graph_id`` is how workers know the graph (``pkg.module:attr``, as given to
    ``bulksync worker --graph``); ``graph`` is the compiled graph this process runs.
    """

    calls_starting = True
    """A step's ``StepLive.starting`` is called once its messages are built, before they go."""

    def __init__(
        self,
        settings: Settings,
        graph_id: str,
        graph: Any,
        *,
        app: Celery | None = None,
        default_timeout: float | None = None,
    ) -> None:
        self.settings = settings
        self.graph_id = graph_id
        self._own_app = app is None
        self.app = app or make_app(settings)
        self.default_timeout = default_timeout or settings.task_timeout
        # One pool for every run this process drives, sized by a setting; a call finding it
        # busy waits. The gatherer holds one connection, whatever the number of steps.
        self.redis = redis_client(settings.redis_url, settings.redis_connections)
        self.gatherer = Gatherer(self.redis, settings)
        direct = DirectPublisher.for_app(self.app, settings)
        self.outbox = Outbox(self.redis, direct, settings.max_merged) if direct else None
        self._paths = {id(spec): path for path, spec in walk_specs(graph)}

    def close(self, wait: float | None = None) -> None:
        """Close the executor's Redis connections, and its Celery app's broker connections
        when it made the app: for when no run uses it any more (``with CeleryExecutor(...)
        as executor:`` closes it at the end). Its gatherer is given ``wait`` seconds
        (default ``idle_wait``) to let go of the steps it gathered; steps still in flight
        then reconnect."""
        if not self.gatherer.join(self.settings.idle_wait if wait is None else wait):
            log.warning(
                "executor of graph %s closed while %d of its steps were in flight: they reconnect",
                self.graph_id,
                self.gatherer.steps,
            )
        self.redis.close()
        if self._own_app:
            self.app.close()

    def __enter__(self) -> CeleryExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        live: StepLive,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> StepHandle:
        """Publish ``tasks``; a gatherer thread delivers their results as they arrive.

        Bookkeeping tasks (``NodeSpec.bookkeeping``: no user code) run here instead, after
        the others are published: a worker round trip would cost more than the task.
        """
        path = self._paths.get(id(spec))
        if path is None:
            raise UnknownGraphError(
                f"graph '{spec.name}' is not part of '{self.graph_id}'; give each graph its "
                "own CeleryExecutor."
            )
        here = [t for t in tasks if spec.nodes[t.name].bookkeeping]
        remote = [t for t in tasks if not spec.nodes[t.name].bookkeeping] if here else tasks
        handle: StepHandle = _Finished()
        if remote:
            run_id = str(step.config.get("run_id") or "")
            handle = CeleryStep(self, spec, step, live, remote, deliver, run_id)
            handle.start(path)
        for task in here:
            deliver(run_task(spec, task, step, live))
        return handle


class _Finished:
    """The handle of a step whose tasks all ran in this process: nothing left to cancel."""

    def cancel(self) -> None:
        """Nothing runs elsewhere."""
