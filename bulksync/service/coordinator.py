"""The coordinator service: claims detached runs from Postgres and drives them concurrently.

``bulksync coordinator --graph …`` runs :meth:`Coordinator.serve`. Its tunables (``max_runs``,
``heartbeat``, ``stale_after``, ``poll_interval``, …) are fields of the ``Settings`` it is
given (``bulksync.settings``, group ``coordinator``). The loop:

1. every ``heartbeat`` seconds, take over runs whose owner stopped heartbeating for
   ``stale_after`` seconds (they become claimable again, and resume from their checkpoint);
2. claim runnable runs, oldest first, up to ``max_runs`` driven at once (the claim takes
   the writer runs' thread leases in its round trip: ``RunStore.claim``); each gets a
   :class:`~bulksync.service.driver.RunDriver`, moved on by the coordinator's ``Reactor``:
   ``drive_threads`` threads in all, however many runs wait on their tasks;
3. every ``heartbeat`` seconds too, announce the graph ids it serves in Redis
   (``keys.served``), so that a client submitting a run of a graph nobody serves is told
   at once instead of waiting for ever. An announcement lasts ``stale_after``, and at least
   ``ANNOUNCED_AT_LEAST`` seconds: it only decides whether clients may queue runs, so a
   heartbeat held up by a slow database must not make them refuse runs it will drive;
4. when nothing more can be claimed, block on Redis ``keys.WAKE`` (clients push there on
   submit, drivers when a run's end lets a run queued on its thread start) for at most
   ``poll_interval`` seconds, taking up to one wake-up per free slot — Postgres stays the
   truth, so a lost wake-up only delays a run until the next look at the table.

A heartbeat thread announces the graphs too, refreshes ``heartbeat_at`` of the runs this
process drives and renews their thread leases (whose time to live is ``stale_after``, so a
lease and its run go stale together). A run another coordinator took over, or whose lease
moved on, is marked lost: its commits are refused by the fence, and its result is dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery

from bulksync import keys, logs
from bulksync.checkpoint.base import LeasingSaver
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.coordinator import clock
from bulksync.coordinator.executor import Executor
from bulksync.coordinator.reactor import Reactor
from bulksync.retry import is_unknown_command, redis_client
from bulksync.service import events, runs
from bulksync.service.driver import DriverContext, RunDriver
from bulksync.service.runs import RunStore
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor
from bulksync.workers.registry import GraphRegistry

log = logging.getLogger("bulksync.coordinator")

# The shortest life of an announcement, in seconds, however short ``stale_after``: the
# heartbeat thread announces before its Postgres calls, and one of those held up for longer
# than a short ``stale_after`` must not make clients refuse runs. A dead coordinator's
# announcement lasting this long only lets a run be queued for the next coordinator.
ANNOUNCED_AT_LEAST = 5.0

ExecutorFactory = Callable[[str, Any], Executor]
"""Builds the executor of a graph id (and its compiled graph)."""


class Coordinator:
    """Claims and drives runs of the graphs in ``registry`` until :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        registry: GraphRegistry,
        store: RunStore,
        saver: LeasingSaver,
        *,
        app: Celery | None = None,
        owner: str | None = None,
        executor_factory: ExecutorFactory | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.store = store
        self.saver = saver
        self.app = app
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Settings checked them on creation (positive; stale_after above the heartbeat).
        self.max_runs = settings.max_runs
        self.heartbeat = settings.heartbeat
        self.stale_after = settings.lease_ttl
        self.poll_interval = settings.poll_interval
        self._executor_factory = executor_factory
        # Sized by a setting and waiting when busy: every driver streams through this pool.
        self.redis = redis_client(settings.redis_url, settings.redis_connections)
        self._executors: dict[str, Executor] = {}
        self._drivers: dict[str, RunDriver] = {}
        self.reactor = Reactor(settings.drive_threads, name="bulksync-drive")
        self._lock = threading.Lock()
        self._announcing = threading.Lock()
        # The serve loop's take-over and the heartbeat thread both beat: one at a time, or
        # their updates of the same lease rows could deadlock in Postgres.
        self._beating = threading.Lock()
        self._stop = threading.Event()
        self._abandoned = threading.Event()
        self._halted = threading.Event()  # stop() returned: the heartbeat ends too
        self._slot_free = threading.Event()
        self._stopped = threading.Event()
        self._serving = False
        self._multi_pop = True  # BLMPOP, until Redis says it has none
        self.ctx = DriverContext(
            store=store,
            saver=saver,
            redis=self.redis,
            owner=self.owner,
            lease_ttl=self.stale_after,
            settings=settings,
            graph_for=registry.get,
            executor_for=self._executor,
            abandoned=self._abandoned,
            reactor=self.reactor,
        )

    # -- lifecycle ----------------------------------------------------------------------

    def serve(self) -> None:
        """Claim and drive runs until :meth:`stop` is called (blocks)."""
        self._stopped.clear()
        self._serving = True
        beat = threading.Thread(target=self._beat, name="bulksync-heartbeat", daemon=True)
        beat.start()
        self._guard(self.announce)  # then the heartbeat thread's, every heartbeat
        next_reap = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_reap:
                    next_reap = now + self.heartbeat
                    self._guard(self._take_over)
                if self._guard(self._claim):
                    continue
                self._wait()
        finally:
            self._stop.set()  # the heartbeat goes on while drivers finish
            if not self._abandoned.is_set():  # a crash leaves its claim to lapse
                self._guard(self._withdraw)
            self._serving = False
            self._stopped.set()

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, embedding).

        The graphs are announced before this returns, so a run submitted right after is
        accepted.
        """
        self._guard(self.announce)
        thread = threading.Thread(target=self.serve, name="bulksync-coordinator", daemon=True)
        thread.start()
        return thread

    def stop(self, *, abandon: bool = False, timeout: float | None = 60.0) -> None:
        """Stop claiming; wait for the runs being driven to finish, ``timeout`` s in all.

        ``abandon=True`` leaves them as a crash would: no final status, no lease released,
        no more heartbeats — another coordinator takes them over once they are stale.
        """
        if abandon:
            self._abandoned.set()
        elif self._abandoned.is_set():
            return  # its drivers were left to a crash's fate
        self._stop.set()
        self._slot_free.set()
        if self._serving:
            self._stopped.wait(timeout=self.poll_interval + 5)
        if not abandon:
            deadline = clock.deadline(timeout)
            for driver in self._active():
                driver.done.wait(clock.left(deadline))
        # Runs still going after the timeout lose their heartbeat: others take them over.
        self._halted.set()
        self.reactor.close()
        # Connections close now rather than at garbage collection; a driver still going
        # reconnects.
        self.redis.close()
        with self._lock:
            executors = list(self._executors.values())
        for executor in executors:
            if isinstance(executor, CeleryExecutor):
                executor.close(wait=0 if abandon else None)  # abandoned steps stay in flight

    @property
    def active(self) -> list[str]:
        """Ids of the runs this coordinator drives now."""
        return [driver.run_id for driver in self._active()]

    # -- the loop -----------------------------------------------------------------------

    def _claim(self) -> bool:
        """Start drivers for claimable runs; True when more may be waiting."""
        free = self.max_runs - len(self._active())
        if free <= 0:
            return False
        claimed = self.store.claim(
            self.owner, free, self.registry.ids(), lease_ttl=self.stale_after
        )
        for run, started in claimed:
            log.info(
                "run %s thread %s: claimed by %s (%s of graph %s)",
                run.run_id,
                run.thread_id,
                self.owner,
                run.kind,
                run.graph_id,
                extra=logs.ids(run_id=run.run_id, thread_id=run.thread_id),
            )
            driver = RunDriver(self.ctx, run, self._driven, started)
            with self._lock:
                self._drivers[run.run_id] = driver
            self.reactor.call(driver.start)
        return len(claimed) == free

    def _driven(self, driver: RunDriver) -> None:
        with self._lock:
            self._drivers.pop(driver.run_id, None)
        self._slot_free.set()

    def _wait(self) -> None:
        """Block until a client's wake-up, a free slot, or ``poll_interval`` seconds."""
        self._slot_free.clear()
        free = self.max_runs - len(self._active())
        if free <= 0:
            # Full: leave wake-ups to coordinators that can take the work.
            self._slot_free.wait(self.poll_interval)
            return
        try:
            self._pop_wakes(free)
        except redis.RedisError as exc:  # Postgres is the truth: go on without wake-ups
            log.warning("coordinator %s: Redis wake-up failed (%s)", self.owner, exc)
            self._stop.wait(self.poll_interval)

    def _pop_wakes(self, free: int) -> None:
        """Wait for wake-ups and take as many as the claim that follows can serve: one per
        free slot (one, before Redis 7). Those left are for other coordinators; those taken
        cost one claim, not one each."""
        if self._multi_pop:
            try:
                self.redis.blmpop(self.poll_interval, 1, keys.WAKE, direction="LEFT", count=free)
                return
            except redis.ResponseError as exc:
                if not is_unknown_command(exc):
                    raise
                log.info("coordinator %s: this Redis has no BLMPOP (before 7.0): BLPOP", self.owner)
                self._multi_pop = False
        self.redis.blpop([keys.WAKE], timeout=self.poll_interval)

    def announce(self) -> None:
        """Tell clients this coordinator serves its graphs, for the next ``stale_after`` s
        (``ANNOUNCED_AT_LEAST`` at least).

        The heartbeat thread repeats it every heartbeat; call it after adding a graph to the
        registry of a coordinator that is already serving, to be served at once. A stopping
        coordinator announces nothing more.
        """
        with self._announcing:
            if self._stop.is_set():  # stopping: it takes no more work, and has withdrawn
                return
            ttl = max(self.stale_after, ANNOUNCED_AT_LEAST)
            events.announce(self.redis, self.registry.ids(), self.owner, ttl)

    def _withdraw(self) -> None:
        with self._announcing:  # after an announcement in flight, never before it
            events.withdraw(self.redis, self.registry.ids(), self.owner)

    def _take_over(self) -> None:
        """Release stale runs of dead coordinators; finish those whose cancel was asked."""
        # Heartbeat first: after a database outage longer than stale_after, this
        # coordinator's own runs look stale too, and must not be taken from it.
        self._beat_once()
        for run in self.store.take_over_stale(self.stale_after):
            log.info(
                "run %s thread %s: its coordinator stopped heartbeating; now %s",
                run.run_id,
                run.thread_id,
                run.status,
                extra=logs.ids(run_id=run.run_id, thread_id=run.thread_id),
            )
            if run.status == runs.CANCELLED:
                events.add_event(
                    self.redis,
                    run.run_id,
                    events.END,
                    events.end_event(run),
                    ttl=self.settings.run_ttl,
                )

    def _beat(self) -> None:
        """Heartbeat the runs driven here and renew their leases, until stopped."""
        while not self._halted.wait(self.heartbeat):
            if self._abandoned.is_set() or (self._stop.is_set() and not self._active()):
                return  # while stop() waits, the runs still finishing keep their claim
            # First, and here rather than in the serve loop, which a slow claim may hold
            # up: a lapsed announcement tells clients nobody serves the graphs.
            self._guard(self.announce)
            self._guard(self._beat_once)

    def _beat_once(self) -> None:
        with self._beating:
            drivers = [d for d in self._active() if not d.done.is_set()]
            owned = self.store.heartbeat(self.owner, [d.run_id for d in drivers])
            leases = {d.lease[0]: d.lease[1] for d in drivers if d.lease is not None}
            renewed = self.saver.renew_leases(self.owner, leases, self.stale_after)
        for driver in drivers:
            lease = driver.lease
            if driver.run_id not in owned or (lease is not None and lease[0] not in renewed):
                driver.lost.set()

    # -- helpers ------------------------------------------------------------------------

    def _active(self) -> list[RunDriver]:
        with self._lock:
            return list(self._drivers.values())

    def _executor(self, graph_id: str) -> Executor:
        with self._lock:
            executor = self._executors.get(graph_id)
            if executor is None:
                graph = self.registry.get(graph_id)
                if self._executor_factory is not None:
                    executor = self._executor_factory(graph_id, graph)
                else:
                    if self.app is None:
                        self.app = make_app(self.settings)
                    executor = CeleryExecutor(self.settings, graph_id, graph, app=self.app)
                self._executors[graph_id] = executor
            return executor

    def _guard(self, step: Callable[[], Any]) -> Any:
        """Run one loop step; a failing service is logged and retried on the next turn."""
        try:
            return step()
        except Exception:
            log.exception("coordinator %s: %s failed", self.owner, step.__name__)
            self._stop.wait(self.poll_interval)
            return False


@contextmanager
def open_coordinator(
    settings: Settings,
    registry: GraphRegistry,
    *,
    app: Celery | None = None,
    owner: str | None = None,
    executor_factory: ExecutorFactory | None = None,
) -> Iterator[Coordinator]:
    """A coordinator with its own Postgres pool (migrations applied); stopped on exit.

    The pool holds ``settings.db_connections`` connections.

    Raises:
        ServiceUnavailableError: Postgres cannot be reached (the URL named).
    """
    url, size = settings.database_url, settings.db_connections
    window = settings.retry_window
    with PostgresSaver.from_conn_string(url, max_size=size, retry_window=window) as s:
        s.setup()
        coordinator = Coordinator(
            settings,
            registry,
            RunStore(s.pool, retry_window=window),
            s,
            app=app,
            owner=owner,
            executor_factory=executor_factory,
        )
        try:
            yield coordinator
        finally:
            coordinator.stop()
