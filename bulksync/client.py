"""Submit runs to the cluster and read their results: ``Client`` and ``RemoteGraph``.

``Client`` talks to the same Postgres (the runs table) and Redis (run event streams, the
coordinators' wake-up list) as the coordinator service; nothing here loads a graph. A run is
inserted as ``pending`` and a coordinator is woken; it drives the run and streams its events
to ``keys.events(run_id)``, which :meth:`Client.stream` reads with ``XREAD BLOCK`` —
resumable from any event id — and :meth:`Client.wait` blocks on.

``RemoteGraph("pkg.module:attr")`` offers the compiled graph's interface (``invoke``,
``stream``, ``get_state``, ``get_state_history``, ``update_state``) with the same signatures
and results, each call a run on the cluster. Errors raised in a run are raised again with
their own type wherever their class is loaded (else as ``StoredError`` naming it).
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
import redis
from psycopg_pool import PoolTimeout

from bulksync import keys
from bulksync.config import merge_configs
from bulksync.coordinator.stream import (
    check_modes,
    check_version,
    frame,
    stream_modes,
    stream_part,
)
from bulksync.errors import ServiceUnavailableError
from bulksync.graph.async_methods import AsyncGraphMethods
from bulksync.redis_lean import LeanRedis
from bulksync.retry import is_transient_redis, retry
from bulksync.service import events, submit
from bulksync.service.events import RunEvent
from bulksync.service.runs import Run, RunStore
from bulksync.settings import Settings
from bulksync.types import GraphOutput, StateSnapshot
from bulksync.urls import redact
from bulksync.workers.callback_relay import CALLBACK_EVENTS, describe, replay
from bulksync.workers.cancel_scope import STOP_WAIT, current_scope
from bulksync.workers.tracing import announce_record, lifecycle_handlers

__all__ = ["Client", "RemoteGraph", "Run", "RunEvent"]

CREATED_KEPT = 10_000
"""How many of the runs it created a ``Client`` remembers (to skip their first row read)."""


class Client:
    """Submits runs to the coordinator service and follows them (connects on first use)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self._stack = ExitStack()
        self._store: RunStore | None = None
        self._redis: redis.Redis | None = None
        # Runs queued here, by when: while their events are surely kept, a wait or a
        # stream need not read the row first to know the run exists.
        self._created: OrderedDict[str, float] = OrderedDict()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (a later call opens them again)."""
        self._stack.close()
        self._store = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None

    # -- runs -------------------------------------------------------------------------

    def submit(
        self,
        graph_id: str,
        input: Any,
        *,
        thread_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        stream_mode: str | Sequence[str] = "values",
        subgraphs: bool = False,
        multitask_strategy: str = "enqueue",
        require_coordinator: bool = True,
        output_keys: Sequence[str] | str | None = None,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        durability: str | None = None,
        context: Any = None,
    ) -> str:
        """Queue a run of ``graph_id`` (as ``invoke`` would run it); return its id.

        ``require_coordinator=False`` queues the run even when no coordinator serves the
        graph yet (one started later picks it up).

        Raises:
            UnservedGraphError: no live coordinator serves ``graph_id`` (and it is required).
            ThreadBusyError: ``multitask_strategy="reject"`` and the thread has an active run.
            ThreadGraphError: the thread belongs to another graph (a ``ValueError``).
            ConfigError: an unknown stream mode or strategy (a ``ValueError``).
            SerializationError: the input or config holds a value msgpack cannot encode.
            ServiceUnavailableError: Postgres or Redis cannot be reached (URL named).
        """
        options = submit.run_options(
            output_keys, interrupt_before, interrupt_after, durability, context
        )
        payload = submit.run_payload(input, config, _listed(stream_mode), subgraphs, options)
        return self.create_run(
            graph_id,
            "invoke",
            payload,
            thread_id=thread_id,
            multitask_strategy=multitask_strategy,
            require_coordinator=require_coordinator,
        )

    def create_run(
        self,
        graph_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        thread_id: str | None = None,
        multitask_strategy: str = "enqueue",
        require_coordinator: bool = True,
    ) -> str:
        """Queue a run of any kind (``runs.KINDS``) with its payload; return its id.

        The thread is ``thread_id``, else the payload config's, else a new one (written
        into the config).

        Raises:
            UnservedGraphError: no live coordinator serves ``graph_id`` and
                ``require_coordinator`` is set: nothing would ever run it.
            ThreadGraphError: the thread belongs to another graph (reads included).
        """
        store, client = self.store, self.redis
        with self._connection_errors():
            run_id = submit.create_run(
                store,
                client,
                graph_id,
                kind,
                payload,
                thread_id=thread_id,
                multitask_strategy=multitask_strategy,
                require_coordinator=require_coordinator,
            )
        self._created[run_id] = time.monotonic()
        if len(self._created) > CREATED_KEPT:
            self._created.popitem(last=False)
        return run_id

    def _created_here(self, run_id: str) -> bool:
        """Whether this client queued the run so recently that its events, if any were
        written, are all still in Redis (half their time to live)."""
        created = self._created.get(run_id)
        return created is not None and time.monotonic() - created < self.settings.run_ttl / 2

    def get(self, run_id: str) -> Run:
        """The run's current row.

        Raises:
            LookupError: no run has this id.
        """
        store = self.store
        with self._connection_errors():
            return store.require(run_id)

    def wait(self, run_id: str, timeout: float | None = None) -> Run:
        """Block until the run finishes (``interrupted`` counts); return its final row.

        Raises:
            TimeoutError: the run did not finish within ``timeout`` seconds.
            LookupError: no run has this id.
        """
        client, key = self.redis, keys.events(run_id)
        last: Any = self._read(lambda: client.xrevrange(key, count=1))
        after = "0"
        if last:
            newest = events.loads_event(*last[0])
            if newest.mode == events.END:
                return self.finished_run(run_id, newest)
            after = newest.id
        elif not self._created_here(run_id):  # no events: queued, unknown, or long over
            run = self.get(run_id)
            if run.finished:
                return run
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in self._events(run_id, after, deadline):
            if event is not None and event.mode == events.END:
                return self.finished_run(run_id, event)
        return self.get(run_id)

    def finished_run(self, run_id: str, end: RunEvent | None) -> Run:
        """The final row of a run whose ``end`` event is ``end``: the row it carries, else
        the row read from Postgres (the event of a large payload or output carries none)."""
        run = None if end is None else events.ended_run(end.chunk, run_id)
        return run or self.get(run_id)

    def stream(
        self, run_id: str, last_event_id: str = "0", *, timeout: float | None = None
    ) -> Iterator[RunEvent]:
        """The run's events after ``last_event_id`` ("0": from the start), until its end.

        Each event has an ``id``: pass the last one seen to resume reading after it.

        Raises:
            TimeoutError: the run did not finish within ``timeout`` seconds.
            LookupError: no run has this id.
        """
        if not self._created_here(run_id):
            self.get(run_id)  # LookupError for an unknown run
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in self._events(run_id, last_event_id, deadline):
            if event is not None:
                yield event

    def watch(
        self, run_id: str, last_event_id: str = "0", *, tick: float = 1.0
    ) -> Iterator[RunEvent | None]:
        """``stream``'s events, and ``None`` whenever ``tick`` seconds pass without one.

        For a live view: its clock must move during a long step that sends nothing. The
        run's row is still read only every ``stream_wait`` seconds, however short ``tick``.

        Raises:
            LookupError: no run has this id.
        """
        self.get(run_id)
        yield from self._events(run_id, last_event_id, None, tick=tick)

    def cancel(self, run_id: str) -> Run:
        """Cancel a run: a pending one at once, a running one as soon as its tasks stop.

        Returns the run's row after the request (a finished run is left as it is).

        Raises:
            LookupError: no run has this id.
        """
        store, client = self.store, self.redis
        with self._connection_errors():
            return submit.cancel(store, client, self.settings, run_id)

    def list_runs(
        self,
        thread_id: str | None = None,
        status: str | None = None,
        limit: int = 20,
        *,
        kinds: Sequence[str] | None = None,
    ) -> list[Run]:
        """Runs newest first, optionally of one thread, one status and some ``kinds``."""
        store = self.store
        with self._connection_errors():
            return store.list(thread_id=thread_id, status=status, limit=limit, kinds=kinds)

    # -- connections --------------------------------------------------------------------

    @property
    def store(self) -> RunStore:
        """The runs table (the pool opens on first use).

        Raises:
            ServiceUnavailableError: Postgres cannot be reached (URL named).
        """
        if self._store is None:
            self._store = self._stack.enter_context(
                RunStore.from_conn_string(
                    self.settings.database_url,
                    max_size=self.settings.runs_pool_size,
                    retry_window=self.settings.retry_window,
                )
            )
        return self._store

    @property
    def redis(self) -> redis.Redis:
        """The Redis client (checked with a PING on first use).

        Raises:
            ServiceUnavailableError: Redis cannot be reached (URL named).
        """
        if self._redis is None:
            client = LeanRedis.from_url(self.settings.redis_url, socket_connect_timeout=3)
            try:
                client.ping()
            except redis.RedisError as exc:
                raise self._redis_unavailable(exc) from None
            self._redis = client
        return self._redis

    @contextmanager
    def _connection_errors(self) -> Iterator[None]:
        """Raise a connection lost in the block as ``ServiceUnavailableError``."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._redis_unavailable(exc) from None
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise ServiceUnavailableError(
                f"lost Postgres at {redact(self.settings.database_url)} ({exc}); check that "
                "it is running and BULKSYNC_DATABASE_URL"
            ) from None

    def _read(self, call: Callable[[], Any]) -> Any:
        """A Redis read, retried through an outage of up to ``retry_window`` seconds (a wait
        goes on through a restart), then raised as ``ServiceUnavailableError``."""
        window = self.settings.retry_window
        with self._connection_errors():
            return retry(call, transient=is_transient_redis, window=window, what="reading events")

    def _redis_unavailable(self, exc: Exception) -> ServiceUnavailableError:
        return ServiceUnavailableError(
            f"cannot reach Redis at {redact(self.settings.redis_url)} ({exc}); start it or "
            "set BULKSYNC_REDIS_URL"
        )

    def _events(
        self, run_id: str, after: Any, deadline: float | None, *, tick: float | None = None
    ) -> Iterator[RunEvent | None]:
        """Events after ``after`` until the end event; blocks only while the run goes on.

        With ``tick``, waits at most that long for an event and yields ``None`` when none came.
        """
        client, key = self.redis, keys.events(run_id)
        finished = False
        wait = self.settings.stream_wait if tick is None else min(tick, self.settings.stream_wait)
        checked = time.monotonic()
        while True:
            block: int | None = None  # a finished run's events are all there: just drain
            if not finished:
                # Between two waits the run's row is checked (an end event may be lost).
                block = max(1, int(wait * 1000))
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(
                            f"run {run_id} did not finish in time; it goes on: wait again, "
                            f"or cancel it (bulksync cancel {run_id})"
                        )
                    block = max(1, min(block, int(left * 1000)))
            read = functools.partial(client.xread, {key: after}, count=500, block=block)
            reply: Any = self._read(read)
            if reply:
                for entry_id, fields in reply[0][1]:
                    event = events.loads_event(entry_id, fields)
                    after = event.id
                    yield event
                    if event.mode == events.END:
                        return
            elif not finished:
                if tick is not None:
                    yield None
                if time.monotonic() - checked >= self.settings.stream_wait or tick is None:
                    checked = time.monotonic()
                    finished = self.get(run_id).finished  # then drain what is left
            else:
                last: Any = self._read(lambda: client.xrevrange(key, count=1))
                if last and events.loads_event(*last[0]).mode == events.END:
                    return  # read from after the end: nothing more to give
                # The end event is missing (the stream expired, or its writer died).
                yield RunEvent(str(after), (), events.END, events.end_event(self.get(run_id)))
                return


class RemoteGraph(AsyncGraphMethods):
    """A graph the cluster runs, with the compiled graph's interface.

    ``graph_id`` is ``pkg.module:attr`` as the coordinator and workers loaded it (nothing is
    imported here). Every call is a run: ``invoke``/``stream`` queue behind the thread's
    active run, reads do not wait. ``timeout`` bounds each wait for a run's result
    (``TimeoutError``; the run goes on); the default waits as long as the run takes.
    """

    def __init__(
        self,
        graph_id: str,
        client: Client | None = None,
        *,
        timeout: float | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.graph_id = graph_id
        self.client = client if client is not None else Client()
        self.timeout = timeout
        self.config = config
        """The config every run starts from (``with_config``), under the one it is given."""

    def with_config(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> RemoteGraph:
        """The same remote graph, each run's config merged over ``config`` (and ``kwargs``)."""
        bound = merge_configs(self.config, {**(config or {}), **kwargs})
        return RemoteGraph(self.graph_id, self.client, timeout=self.timeout, config=bound)

    def invoke(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str = "values",
        output_keys: Sequence[str] | str | None = None,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        durability: str | None = None,
        version: str = "v1",
        context: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Run to the end (or a pause) and return the output values, as the local graph
        (``version="v2"``: a ``GraphOutput``, its value a dict: no schema is loaded here)."""
        check_version(version)
        kw = submit.run_options(output_keys, interrupt_before, interrupt_after, durability, context)
        if stream_mode != "values":
            return list(self.stream(input, config, stream_mode=stream_mode, version=version, **kw))
        config = merge_configs(self.config, config)
        callbacks = _CallerCallbacks(config)
        payload = submit.run_payload(input, config, [], False, kw, callbacks.asked())
        run_id = self.client.create_run(self.graph_id, "invoke", payload)
        self._cancelled_with_caller(run_id)
        if callbacks:  # what the run reports to them comes on its stream
            for event in self.client.stream(run_id, timeout=self.timeout):
                self._tell(run_id, callbacks, event)
        output = _result(self.client.wait(run_id, self.timeout))
        if version == "v2":
            part = stream_part((), "values", output)
            return GraphOutput(value=part["data"], interrupts=part["interrupts"])
        return output

    def stream(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str | Sequence[str] | None = None,
        output_keys: Sequence[str] | str | None = None,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        durability: str | None = None,
        subgraphs: bool = False,
        debug: bool | None = None,
        version: str = "v1",
        context: Any = None,
        **kwargs: Any,
    ) -> Iterator[Any]:
        """Run and yield the chunks the local graph would, framed the same way (v2 parts'
        values stay dicts: no schema is loaded here)."""
        check_version(version)
        modes, bare = stream_modes(stream_mode, bool(debug))
        config = merge_configs(self.config, config)
        callbacks = _CallerCallbacks(config)
        options = submit.run_options(
            output_keys, interrupt_before, interrupt_after, durability, context
        )
        payload = submit.run_payload(input, config, modes, subgraphs, options, callbacks.asked())
        run_id = self.client.create_run(self.graph_id, "stream", payload)
        self._cancelled_with_caller(run_id)
        end = None
        for event in self.client.stream(run_id):
            if event.mode == events.END:
                end = event
                break
            if callbacks:
                self._tell(run_id, callbacks, event)
            if event.mode not in modes:
                continue
            if version == "v2":
                yield stream_part(event.namespace, event.mode, event.chunk)
            else:
                yield frame(
                    event.namespace, event.mode, event.chunk, subgraphs=subgraphs, bare=bare
                )
        _result(self.client.finished_run(run_id, end))

    def _tell(self, run_id: str, callbacks: _CallerCallbacks, event: RunEvent) -> None:
        """Hand the caller's handlers what the run reported to them; a lifecycle handler
        with ``raise_error`` that raises stops the run, as it would locally."""
        try:
            callbacks.tell(run_id, event)
        except BaseException:
            self._stop_run(run_id)
            raise

    def _cancelled_with_caller(self, run_id: str) -> None:
        """A caller that stops (``ainvoke`` cancelled, ``astream`` broken off) cancels the
        run on the cluster too (``workers/cancel_scope.py``)."""
        scope = current_scope()
        if scope is not None:
            scope.on_cancel(functools.partial(self._stop_run, run_id))

    def _stop_run(self, run_id: str) -> None:
        """Cancel the run and wait (``STOP_WAIT`` at most) until it has ended, its running
        nodes stopped, as a caller stopping an in-process run waits for its nodes."""
        self.client.cancel(run_id)
        with contextlib.suppress(TimeoutError):
            self.client.wait(run_id, timeout=STOP_WAIT)

    def get_state(self, config: Mapping[str, Any], *, subgraphs: bool = False) -> StateSnapshot:
        """The thread's current state (or at ``checkpoint_id``), with its next tasks."""
        snapshot: StateSnapshot = self._call("get_state", config, {"subgraphs": subgraphs})
        return snapshot

    def get_state_history(
        self,
        config: Mapping[str, Any],
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[StateSnapshot]:
        """The thread's checkpoints, newest first, as snapshots."""
        options = {"filter": filter, "before": before, "limit": limit}
        history: list[StateSnapshot] = self._call("get_state_history", config, options)
        return iter(history)

    def update_state(
        self,
        config: Mapping[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> dict[str, Any]:
        """Apply ``values`` as if ``as_node`` returned them; return the new checkpoint's config."""
        return self.bulk_update_state(config, [[(values, as_node, task_id)]])

    def bulk_update_state(
        self, config: Mapping[str, Any], supersteps: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        """Apply several supersteps of updates, a checkpoint each; the last one's config."""
        steps = [[list(update) for update in updates] for updates in supersteps]
        result: dict[str, Any] = self._call("update_state", config, {}, supersteps=steps)
        return result

    def _call(
        self, kind: str, config: Mapping[str, Any], options: Mapping[str, Any], **extra: Any
    ) -> Any:
        payload = {"config": submit.run_config(config), "options": dict(options), **extra}
        run_id = self.client.create_run(self.graph_id, kind, payload)
        return _result(self.client.wait(run_id, self.timeout))


class _CallerCallbacks:
    """The callback handlers in a remote run's config, which the run reports to through
    its stream: lifecycle handlers its pauses and resumptions, LangChain handlers its own
    and its tasks' callbacks (``callback_relay``). False when there are none."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.handlers = config.get("callbacks")
        self.lifecycle = lifecycle_handlers(config)
        self.trace = describe(self.handlers)
        self.run_id = config.get("run_id")
        """The caller's id for the run (``astream_events`` sets one), else the cluster's."""

    def __bool__(self) -> bool:
        return bool(self.lifecycle) or self.trace is not None

    def asked(self) -> dict[str, Any]:
        """What the run's payload asks the service to report."""
        wanted: dict[str, Any] = {"trace": self.trace} if self.trace is not None else {}
        if self.lifecycle:
            wanted["lifecycle"] = True
        return wanted

    def tell(self, run_id: str, event: RunEvent) -> None:
        """Hand ``event`` of run ``run_id`` to the handlers it is for, if any."""
        own_id = self.run_id or uuid.UUID(run_id)
        if event.mode == events.LIFECYCLE:
            announce_record(self.lifecycle, event.chunk, own_id)
        elif event.mode == CALLBACK_EVENTS:
            replay(self.handlers, event.chunk, rename={run_id: own_id})


def _listed(stream_mode: str | Sequence[str]) -> list[str]:
    modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
    check_modes(modes)
    return modes


def _result(run: Run) -> Any:
    """A finished run's output, or its error raised again."""
    error = run.exception()
    if error is not None:
        raise error
    return run.output
