"""Driving one detached run on the coordinator service's reactor, without a thread of its own.

The driver holds no thread while its run's tasks are on the workers: the run's loop is
moved on by the coordinator's ``Reactor`` (``coordinator/reactor.py``) as results arrive,
and the chunks it streams are written to the run's Redis stream in batches, in order, by a
``Serial`` of the driver's own — one round trip for all the events that piled up meanwhile.

A writer run (``invoke``, ``stream``, ``update_state``) first takes its thread's lease, so no
other coordinator can commit to the thread meanwhile; its checkpoints go through a saver
fenced with the lease's token. ``invoke``/``stream`` runs stream the registry graph bound to
the coordinator's executor and push every chunk the caller asked for to the run's Redis
stream, plus ``progress`` events; the row gets its final status, then the stream its last
chunks and its ``end`` event (which carries the final row: ``events.end_event``), in one
round trip. Reads (``get_state``, ``get_state_history``) need no lease.

**Taking a run over.** A run whose coordinator died is claimed again by another one. Its
input must not be applied twice: when first driven, the run records the thread's head
checkpoint and its number of input writes (in the round trip that takes the thread's
lease: ``RunStore.claim``, else ``RunStore.start``; it reads no values). Driven again, it
compares them with the thread now — a newer head, or input writes added on the same head,
mean the input was applied, and the run resumes with ``None`` (LangGraph's "continue the
thread"); otherwise it starts from its input as if for the first time. The loop then
replans the head's tasks: those with pending writes in Postgres or results in Redis are
not run again.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from bulksync import logs
from bulksync.checkpoint.base import CheckpointTuple, LeasingSaver
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, INTERRUPT, THREAD_ID
from bulksync.coordinator.commands import is_resume_map
from bulksync.coordinator.executor import Executor
from bulksync.coordinator.loop import SuperstepLoop
from bulksync.coordinator.reactor import Reactor, Serial
from bulksync.coordinator.spec import RunnableGraph
from bulksync.coordinator.stream import TASK_STEPS
from bulksync.errors import LeaseLostError, TaskCancelledError, TaskTimeoutError, error_text
from bulksync.retry import is_transient_redis, retry
from bulksync.service import events, runs
from bulksync.service.cancel import cancel_run
from bulksync.service.runs import Run, RunStore, Started
from bulksync.settings import Settings
from bulksync.types import Command
from bulksync.workers import wire
from bulksync.workers.callback_relay import CALLBACK_EVENTS, relay_manager

log = logging.getLogger("bulksync.coordinator")

_Chunk = tuple[tuple[str, ...], str, Any]
"""A chunk of a run's stream: its namespace, mode and value."""

# Output, interrupts, and progress (task counts from the tasks' debug events; where tasks
# are, from progress).
_INTERNAL_MODES = ("values", "updates", TASK_STEPS, events.PROGRESS)


@dataclasses.dataclass(frozen=True)
class DriverContext:
    """What every driver of one coordinator shares."""

    store: RunStore
    saver: LeasingSaver
    redis: redis.Redis
    owner: str
    lease_ttl: float
    settings: Settings
    graph_for: Callable[[str], RunnableGraph]
    executor_for: Callable[[str], Executor]
    abandoned: threading.Event
    reactor: Reactor


class RunDriver:
    """Drives one claimed run to its final status: :meth:`start` it on a reactor thread;
    ``done`` is set once the run has its final status (or was given up)."""

    def __init__(
        self,
        ctx: DriverContext,
        run: Run,
        ended: Callable[[RunDriver], None] | None = None,
        started: Started | None = None,
    ) -> None:
        """``started``: the run's start when its claim took the thread's lease."""
        self.ctx = ctx
        self.run_row = run
        self._started = started
        self.lease = None if started is None else (run.thread_id, started[0])
        self.lost = threading.Event()  # another coordinator owns the run or its thread now
        self.done = threading.Event()
        self.began = time.monotonic()
        self._ended = ended
        self._loop: SuperstepLoop | None = None
        self._serial = Serial(ctx.reactor)
        self._lock = threading.Lock()
        self._outbox: list[_Chunk] = []
        self._wanted: list[str] = []
        self._tracker = _Tracker(ctx.settings.progress_interval)
        self._broken: BaseException | None = None  # the run's events could not be written
        self._ending = False  # the loop has ended: its last chunks go with the end event
        self._last: list[_Chunk] = []  # those chunks
        self._released = False  # the lease went with the final status

    @property
    def run_id(self) -> str:
        """The id of the run this driver drives."""
        return self.run_row.run_id

    def start(self) -> None:
        """Begin the run; returns once it waits on its tasks (or has ended). Never raises:
        a failure becomes the run's ``error`` status."""
        try:
            if not self._begin():
                self._close()
        except Exception as exc:  # a bug or a lost service: record it rather than hang the run
            self._failed(exc)

    def _begin(self) -> bool:
        """Start the run; False when it is over already (a read, an update, a cancel)."""
        run = self.run_row
        if run.cancel_requested:
            self._finish(runs.CANCELLED, error=TaskCancelledError(f"run {run.run_id} cancelled"))
            return False
        graph = self.ctx.graph_for(run.graph_id)  # claimed because it is loaded here
        payload = run.payload
        if run.kind in runs.READ_KINDS:
            try:
                output = self._read(graph, run.kind, payload)
            except Exception as exc:  # a bad config, an unencodable value: the caller's error
                self._finish(runs.ERROR, error=exc)
            else:
                self._finish(runs.SUCCESS, output=output)
            return False
        started = self._acquire(run)
        if started is None:
            return not self.ctx.abandoned.is_set()  # tried again later, or given up
        token, head, writes = started
        saver = self.ctx.saver.fenced(run.thread_id, token, empty=head is None)
        moved = grew = False
        if run.start_writes is not None:  # driven before: what did it leave on the thread?
            moved = head != run.start_checkpoint
            grew = writes > run.start_writes
        bound = graph.with_checkpointer(saver)
        if run.kind == "update_state":
            applied = saver.get_tuple(_head_config(run.thread_id)) if moved else None
            self._update_state(bound, payload, applied)
            return False
        value = payload["input"]
        if moved or grew:
            value = None if moved else _resume_input(value)
            log.info(
                "run %s thread %s: taken over, resuming the thread",
                run.run_id,
                run.thread_id,
                extra=logs.ids(run_id=run.run_id, thread_id=run.thread_id),
            )
        executor = self.ctx.executor_for(run.graph_id)
        self._stream(bound.with_executor(executor), payload, value, resumed=moved or grew)
        return True

    # -- kinds ------------------------------------------------------------------------

    def _read(self, graph: Any, kind: str, payload: Mapping[str, Any]) -> bytes:
        bound = graph.with_checkpointer(self.ctx.saver)
        if kind == "get_state":
            return wire.SERDE.dumps(bound.get_state(payload["config"], **payload["options"]))
        history = bound.get_state_history(payload["config"], **payload["options"])
        return wire.SERDE.dumps(list(history))

    def _update_state(
        self, bound: Any, payload: Mapping[str, Any], applied: CheckpointTuple | None
    ) -> None:
        if applied is not None:  # committed before a takeover: report it, don't repeat it
            self._finish(runs.SUCCESS, output=wire.SERDE.dumps(applied.config))
            return
        # A run queued before supersteps existed carries one update as values and options.
        options = payload.get("options") or {}
        one = (payload.get("values"), options.get("as_node"), options.get("task_id"))
        supersteps = payload.get("supersteps", [[one]])
        try:
            config = bound.bulk_update_state(payload["config"], supersteps)
        except LeaseLostError:
            self.lost.set()
            return
        except Exception as exc:  # an unknown node or key: the caller's error
            self._finish(runs.ERROR, error=exc)
            return
        self._finish(runs.SUCCESS, output=wire.SERDE.dumps(config))

    def _stream(self, bound: Any, payload: Mapping[str, Any], value: Any, *, resumed: bool) -> None:
        run = self.run_row
        config = dict(payload["config"])
        config["configurable"] = {**(config.get("configurable") or {}), THREAD_ID: run.thread_id}
        config["run_id"] = run.run_id
        if resumed:
            config["configurable"].pop(CHECKPOINT_ID, None)  # continue from the head
        self._wanted = list(payload["stream_mode"])
        options = dict(payload["options"])
        if run.kind == "invoke" and options.get("output_keys") is None:
            options["output_keys"] = bound.spec.output_channels  # as invoke() does
        options["durability"] = options.get("durability") or "sync"
        modes = [*self._wanted, *(m for m in _INTERNAL_MODES if m not in self._wanted)]
        if payload.get("lifecycle"):  # the caller has lifecycle handlers: tell it
            options["lifecycle"] = lambda record: self._event((), events.LIFECYCLE, record)
        if payload.get("trace") is not None:  # and LangChain handlers: relay the callbacks
            self._relay_callbacks(config, payload["trace"])
        # Asked through, not filtered here: a graph a node runs on its own thread reaches
        # this stream at its own (root) namespaces only when subgraphs are read.
        self._loop = bound.start(
            value,
            config,
            self.ctx.reactor,
            self._event,
            self._stream_ended,
            stream_mode=modes,
            subgraphs=bool(payload["subgraphs"]),
            **options,
        )

    def _relay_callbacks(self, config: dict[str, Any], trace: Mapping[str, Any]) -> None:
        """Report the run's callbacks (and its tasks') to the caller's handlers through the
        run's stream: a relay stands for them in the config (needs langchain-core here)."""
        if importlib.util.find_spec("langchain_core") is None:
            log.warning(
                "run %s: the caller's callback handlers hear nothing of it: langchain-core "
                "is not installed on this coordinator (pip install 'bulksync[agents]')",
                self.run_id,
            )
            return
        emit = functools.partial(self._event, (), CALLBACK_EVENTS)
        config["callbacks"] = relay_manager(trace, emit)

    # -- the run's events -----------------------------------------------------------------

    def _event(self, namespace: tuple[str, ...], mode: str, chunk: Any) -> None:
        """Queue one chunk of the run for its stream (from any thread; written in order)."""
        if self.ctx.abandoned.is_set():
            loop = self._loop
            if loop is not None:
                loop.abandon()  # as a stream nobody reads any more
            return
        with self._lock:
            self._outbox.append((namespace, mode, chunk))
            first = len(self._outbox) == 1
        if first:  # written once the loop waits: not while it commits or publishes
            self.ctx.reactor.when_waiting(
                functools.partial(self._serial.submit, self._write_events)
            )

    def _write_events(self) -> None:
        """Write every queued chunk the caller asked for, and the progress events they
        make, in one Redis round trip. Once the loop has ended, they wait for the run's end
        event instead and go in its round trip."""
        if not self._ending:
            self._write(self._take_events())

    def _take_events(self) -> list[_Chunk]:
        """The queued chunks the caller asked for and the progress events they make (the
        tracker sees every chunk here)."""
        with self._lock:
            taken, self._outbox = self._outbox, []
        batch = []
        for namespace, mode, chunk in taken:
            wanted = mode not in _INTERNAL_MODES or mode in self._wanted
            if wanted and mode != events.PROGRESS:  # progress: the tracker's events, below
                batch.append((namespace, mode, chunk))
            if not namespace:
                progress = self._tracker.observe(mode, chunk)
                if progress is not None:
                    batch.append(((), events.PROGRESS, progress))
        return batch

    def _write(self, batch: list[_Chunk]) -> None:
        if not batch or self._broken is not None:
            return
        ttl = self.ctx.settings.run_ttl
        try:
            # Retried through a Redis outage: at worst a reply lost after the append repeats
            # events, where giving up would end the run in error.
            retry(
                lambda: events.add_events(self.ctx.redis, self.run_id, batch, ttl=ttl),
                transient=is_transient_redis,
                window=self.ctx.settings.retry_window,
                what=f"run {self.run_id}: streaming {len(batch)} event(s)",
                stop=self.ctx.abandoned,
            )
        except Exception as exc:  # the run cannot be followed: stop it, its tasks too
            self._broken = exc
            loop = self._loop
            if loop is not None:
                loop.abandon()
            try:
                cancel_run(self.ctx.redis, self.run_id, self.ctx.settings)
            except Exception:  # Redis is gone: the tasks finish, nobody gathers them
                log.warning("run %s: could not cancel its tasks", self.run_id)

    def _stream_ended(self, outcome: Any, error: BaseException | None) -> None:
        """The loop ended (on a reactor thread): the status, then its last events with the
        end event."""
        self._ending = True
        self._serial.submit(functools.partial(self._settle, error))

    def _settle(self, error: BaseException | None) -> None:
        try:
            if self.ctx.abandoned.is_set():
                return
            self._last = self._take_events()  # the output is in the last values chunk
            if self._broken is not None:
                self._finish(runs.ERROR, error=self._broken)
            elif isinstance(error, TaskCancelledError):
                self._finish(runs.CANCELLED, error=error)
            elif isinstance(error, TaskTimeoutError):
                self._finish(runs.TIMEOUT, error=error)
            elif isinstance(error, LeaseLostError):
                log.warning("run %s: %s", self.run_id, error)
                self._write(self._last)  # the new owner writes the end
                self.lost.set()
            elif error is not None:  # the run's own failure (a node, a bad input, …)
                self._finish(runs.ERROR, error=error)
            else:
                status = runs.INTERRUPTED if self._tracker.interrupted else runs.SUCCESS
                self._finish(status, output=wire.SERDE.dumps(self._tracker.output()))
        except Exception as exc:
            self._failed(exc)
        else:
            self._close()

    # -- lease, final status ----------------------------------------------------------

    def _acquire(self, run: Run) -> Started | None:
        """The thread's lease and head (``RunStore.start``), or None: while another
        coordinator's lease is still live (it ends by expiry), the run starts again a moment
        later, on the reactor."""
        started, self._started = self._started, None  # taken with the claim, if it was
        ttl = self.ctx.lease_ttl
        if started is None:
            started = self.ctx.store.start(run.run_id, self.ctx.owner, run.thread_id, ttl)
        if started is not None:
            self.lease = (run.thread_id, started[0])
        elif not self.ctx.abandoned.is_set():
            self.ctx.reactor.later(min(1.0, ttl / 4), self.start)
        return started

    def _failed(self, exc: BaseException) -> None:
        log.error("run %s: driver failed", self.run_id, exc_info=exc)
        try:
            self._finish(runs.ERROR, error=exc)
        except Exception:  # the row stays running: a live coordinator takes it over
            log.exception("run %s: could not record its failure", self.run_id)
        self._close()

    def _close(self) -> None:
        """The run is over here: release its lease, tell the coordinator."""
        if self.done.is_set():
            return
        if self.lease is not None and not self._released and not self.ctx.abandoned.is_set():
            thread, token = self.lease
            try:
                self.ctx.saver.release_lease(thread, self.ctx.owner, token)
            except Exception:  # expiry frees it anyway
                log.warning("run %s: could not release the lease of thread %s", *self.lease)
        self.done.set()
        self._loop = None  # the loop's sink calls back here: no cycle outlives the run
        if self._ended is not None:
            self._ended(self)

    def _finish(
        self, status: str, *, output: bytes | None = None, error: BaseException | None = None
    ) -> None:
        if self.ctx.abandoned.is_set():
            return
        text = None
        if error is not None:
            output = wire.dumps_error(error)
            text = error_text(error)  # with the note naming the node and task, if any
        finished = self.ctx.store.finish(
            self.run_id, self.ctx.owner, status, output=output, error=text, lease=self.lease
        )
        self._released = self.lease is not None  # in the same round trip
        if finished is None:
            log.warning("run %s: another coordinator owns it now; result dropped", self.run_id)
            self.lost.set()
            return
        thread = self.run_row.thread_id
        log.log(
            logging.WARNING if status in (runs.ERROR, runs.TIMEOUT) else logging.INFO,
            "run %s thread %s: finished %s in %.2fs (%s of graph %s)%s",
            self.run_id,
            thread,
            status,
            time.monotonic() - self.began,
            self.run_row.kind,
            self.run_row.graph_id,
            f": {text}" if text else "",
            extra=logs.ids(run_id=self.run_id, thread_id=thread),
        )
        # The run's last events, the end event after them, and, when a writer run queued
        # behind this one on its thread may start now, a coordinator's wake-up: one round
        # trip.
        last, self._last = [*self._last, *self._take_events()], []
        end = [
            *(last if self._broken is None else ()),
            ((), events.END, events.end_event(finished.run)),
        ]
        retry(
            lambda: events.add_events(
                self.ctx.redis,
                self.run_id,
                end,
                ttl=self.ctx.settings.run_ttl,
                wake=finished.queued,
            ),
            transient=is_transient_redis,
            window=self.ctx.settings.retry_window,
            what=f"run {self.run_id}: streaming its end",
            stop=self.ctx.abandoned,
        )


class _Tracker:
    """Follows the root graph's chunks: the invoke-style output, interrupts and progress.

    A step's progress events are ``every`` seconds apart, except its first and last; each
    carries the step, its tasks done and in all, how long it has run (``elapsed_s``), per
    node its tasks in all, done and failed (``nodes``), and — once a cluster executor has
    looked at the step's tasks (``progress`` chunks) — where the others are: queued, running
    (on which workers, for how long; per node too), and queues whose tasks no worker takes.
    """

    def __init__(self, every: float) -> None:
        self.every = every
        self.latest: Any = None
        self.interrupts: list[Any] = []
        self.interrupted = False
        self.step: int | None = None
        self.done = 0
        self.total = 0
        self.sent = 0.0
        self.began = 0.0
        self.nodes: dict[str, dict[str, int]] = {}  # per node: total, done, failed
        self.where: dict[str, Any] = {}  # the step's latest ``progress`` chunk, counts aside

    def observe(self, mode: str, chunk: Any) -> dict[str, Any] | None:
        """Take one chunk; return a progress event to send, if one is due."""
        if mode == events.PROGRESS and isinstance(chunk, dict):
            if chunk.get("step") != self.step:
                return None  # a step that has ended meanwhile
            self.where = {k: v for k, v in chunk.items() if k not in ("step", "done", "total")}
            return self._event(time.monotonic())
        if mode == "values":
            self.latest = chunk
        elif mode == "updates" and isinstance(chunk, dict) and INTERRUPT in chunk:
            self.interrupted = True
            self.interrupts.extend(chunk[INTERRUPT])
        elif mode == TASK_STEPS and isinstance(chunk, dict):
            payload = chunk.get("payload")
            name = payload.get("name") if isinstance(payload, dict) else None
            if chunk.get("type") == "task":
                if chunk.get("step") != self.step:
                    self.step, self.done, self.total = chunk.get("step"), 0, 0
                    self.where, self.nodes, self.began = {}, {}, time.monotonic()
                self.total += 1
                self._node(name)["total"] += 1
            elif chunk.get("type") == "task_result" and chunk.get("step") == self.step:
                self.done += 1
                failed = isinstance(payload, dict) and payload.get("error") is not None
                self._node(name)["failed" if failed else "done"] += 1
                now = time.monotonic()
                if self.done in (1, self.total) or now - self.sent >= self.every:
                    return self._event(now)
        return None

    def _node(self, name: Any) -> dict[str, int]:
        return self.nodes.setdefault(str(name), {"total": 0, "done": 0, "failed": 0})

    def _event(self, now: float) -> dict[str, Any]:
        self.sent = now
        where = self.where.get("nodes") or {}
        nodes = {
            name: {**counts, **where.get(name, {"queued": 0, "running": 0})}
            for name, counts in self.nodes.items()
        }
        return {
            "step": self.step or 0,
            "done": self.done,
            "total": self.total,
            **self.where,
            "elapsed_s": round(now - self.began, 3),
            "nodes": nodes,
        }

    def output(self) -> Any:
        """What ``invoke`` returns for the chunks seen (same rule as the local graph)."""
        if not self.interrupts:
            return self.latest
        if isinstance(self.latest, dict):
            return {**self.latest, INTERRUPT: self.interrupts}
        return {INTERRUPT: self.interrupts}


def _head_config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {THREAD_ID: thread_id, CHECKPOINT_NS: ""}}


def _resume_input(value: Any) -> Any:
    """The input that continues a run whose ``Command`` left its writes on the same head.

    Its update, gotos and single resume answer are recorded writes by now; a resume map
    lives only in the run, so it is given again.
    """
    if isinstance(value, Command) and is_resume_map(value.resume):
        return Command(resume=value.resume)
    return None
