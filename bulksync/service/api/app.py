"""The HTTP API's application: its connections, errors, key check and body limit.

``create_app(settings, registry)`` builds the ASGI app ``bulksync api`` serves with uvicorn.
It holds one Postgres pool (runs, threads, checkpoints), a Redis client for run streams and
an asyncio one for following them; the graphs of ``registry`` are its assistants, read
directly for states, drawings and schemas. Runs themselves are queued for the coordinators,
as ``Client`` queues them.

Errors are JSON, ``{"detail": "..."}`` as the Agent Server writes them, with the status
that says what went wrong: 404 for an unknown assistant, thread or run, 409 for a busy
thread, a taken id or a thread of another graph, 413 for a body over ``api_max_body``, 422
for bad input (the field named), 503 naming the service that cannot be reached.
"""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import psycopg
import redis
import redis.asyncio as aredis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bulksync import keys
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.errors import (
    ConflictError,
    RequestTooLargeError,
    ServiceUnavailableError,
    ThreadBusyError,
    ThreadExistsError,
    ThreadGraphError,
    UnservedGraphError,
)
from bulksync.redis_lean import LeanRedis
from bulksync.service import events
from bulksync.service.api import streaming
from bulksync.service.events import RunEvent
from bulksync.service.runs import Run, RunStore
from bulksync.service.threads import Thread, ThreadStore
from bulksync.settings import Settings
from bulksync.urls import redact
from bulksync.workers.registry import GraphRegistry

log = logging.getLogger("bulksync.api")

OPEN_PATHS: Final = frozenset({"/ok", "/health", "/docs", "/openapi.json"})
"""Paths served without a key: probes and the API's description (no data in them)."""


@dataclasses.dataclass
class Backend:
    """What every request of one API process shares."""

    settings: Settings
    registry: GraphRegistry
    saver: PostgresSaver
    store: RunStore
    threads: ThreadStore
    redis: redis.Redis
    streams: aredis.Redis
    started: datetime.datetime

    def thread(self, thread_id: str) -> Thread:
        """The thread's row.

        Raises:
            LookupError: no thread has this id.
        """
        row = self.threads.get(thread_id)
        if row is None:
            raise LookupError(f"no thread '{thread_id}'; create it (POST /threads) or list them")
        return row

    def graph(self, row: Thread) -> Any:
        """The thread's graph bound to the checkpoints, or None for a thread no run used yet.

        Raises:
            ConflictError: the thread's graph is not loaded here (named, with what to do).
        """
        if row.graph_id is None:
            return None
        if row.graph_id not in self.registry:
            module = row.graph_id.partition(":")[0]
            raise ConflictError(
                f"thread '{row.thread_id}' belongs to graph '{row.graph_id}', which this server "
                f"did not load; start `bulksync api` with --graph {module}"
            )
        return self.registry.get(row.graph_id).with_checkpointer(self.saver)

    async def row(self, run_id: str) -> Run:
        """The run's row, read on a worker thread.

        Raises:
            LookupError: no run has this id.
        """
        found = await run_in_threadpool(self.store.get, run_id)
        if found is None:
            raise LookupError(f"no run '{run_id}'")
        return found

    def events(self, run_id: str, after: str = "0") -> AsyncIterator[RunEvent]:
        """The run's events after ``after`` up to its end (``streaming.follow``)."""
        block = int(self.settings.stream_wait * 1000)
        return streaming.follow(self.streams, run_id, after, lambda: self.row(run_id), block)

    async def finished(self, run_id: str) -> Run:
        """The run's row once it has finished (``interrupted`` counts)."""
        run = await self.row(run_id)
        if run.finished:
            return run
        last: Any = await self.streams.xrevrange(keys.events(run_id), count=1)
        after = "0"
        if last:
            newest = events.loads_event(*last[0])
            if newest.mode == events.END:
                return await self._ended(run_id, newest)
            after = newest.id
        end = None
        async for event in self.events(run_id, after):
            end = event  # the end event comes last
        return await self._ended(run_id, end)

    async def _ended(self, run_id: str, end: RunEvent | None) -> Run:
        """The final row the run's end event carries, else the row read from Postgres."""
        run = None if end is None else events.ended_run(end.chunk, run_id)
        return run or await self.row(run_id)


def create_app(settings: Settings, registry: GraphRegistry) -> FastAPI:
    """The API over the cluster ``settings`` name, its assistants the graphs of ``registry``."""
    from bulksync.service.api import assistants, health, runs, threads, ui

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        window = settings.api_retry_window
        with PostgresSaver.from_conn_string(
            settings.database_url,
            max_size=settings.db_connections,
            retry_window=window,
            pool_wait=window,
        ) as saver:
            saver.setup()
            streams = aredis.Redis.from_url(settings.redis_url, socket_connect_timeout=3)
            client = LeanRedis.from_url(settings.redis_url, socket_connect_timeout=3)
            app.state.backend = Backend(
                settings=settings,
                registry=registry,
                saver=saver,
                store=RunStore(saver.pool, retry_window=window),
                threads=ThreadStore(saver.pool, retry_window=window),
                redis=client,
                streams=streams,
                started=datetime.datetime.now(datetime.UTC),
            )
            try:
                yield
            finally:
                client.close()
                await streams.aclose()

    app = FastAPI(
        title="bulksync",
        summary="LangGraph's Agent Server API over a bulksync cluster",
        lifespan=lifespan,
    )
    for module in (health, assistants, threads, runs, ui):
        app.include_router(module.router)
    for kind, status in _STATUS.items():
        app.add_exception_handler(kind, _answer(status))
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_middleware(_BodyLimit, limit=settings.api_max_body)
    app.add_middleware(_KeyCheck, keys=settings.api_key_set)
    return app


def backend(request: Request) -> Backend:
    """The request's backend (a FastAPI dependency)."""
    found: Backend = request.app.state.backend
    return found


_STATUS: Final[dict[type[Exception], int]] = {
    LookupError: 404,
    ThreadBusyError: 409,
    ThreadExistsError: 409,
    ThreadGraphError: 409,
    ConflictError: 409,
    RequestTooLargeError: 413,
    ValueError: 422,
    ServiceUnavailableError: 503,
    UnservedGraphError: 503,
    redis.ConnectionError: 503,
    redis.TimeoutError: 503,
    psycopg.OperationalError: 503,
    PoolTimeout: 503,
}


def _answer(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def answer(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": _detail(exc, request)}, status_code=status)

    return answer


def _detail(exc: Exception, request: Request) -> str:
    if isinstance(exc, redis.RedisError):
        url = request.app.state.backend.settings.redis_url
        return f"Redis at {redact(url)} cannot be reached ({exc}); retry when it is back"
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        url = request.app.state.backend.settings.database_url
        return f"Postgres at {redact(url)} cannot be reached ({exc}); retry when it is back"
    message = str(exc)
    if isinstance(exc, KeyError) and exc.args:  # KeyError's str() is the key's repr
        message = str(exc.args[0])
    return message


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    """A body or parameter of the wrong shape: 422 naming each field at fault."""
    assert isinstance(exc, RequestValidationError)
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    detail = "; ".join(problems) or "invalid request"
    return JSONResponse({"detail": detail, "errors": exc.errors()}, status_code=422)


class _KeyCheck:
    """Every request but ``OPEN_PATHS`` needs one of ``keys`` in ``x-api-key`` (when any is
    set); the key itself is never logged."""

    def __init__(self, app: ASGIApp, keys: frozenset[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")  # the run view's pages (/ui, not its /ui/api): no data
        page = (path + "/").startswith("/ui/") and not path.startswith("/ui/api")
        if scope["type"] != "http" or not self.keys or path in OPEN_PATHS or page:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-api-key", b"")
        if any(hmac.compare_digest(given, key) for key in self.keys):
            await self.app(scope, receive, send)
            return
        what = "a wrong x-api-key" if given else "no x-api-key header"
        log.warning("refused %s %s: %s", scope["method"], scope["path"], what)
        detail = f"{what}: send one of the keys set in BULKSYNC_API_KEYS as x-api-key"
        await JSONResponse({"detail": detail}, status_code=401)(scope, receive, send)


class _BodyLimit:
    """Refuses a body over ``limit`` bytes with 413, before the endpoint reads any of it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise RequestTooLargeError(str(self.limit))
            return message

        try:
            await self.app(scope, counted, send)
        except RequestTooLargeError:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = (
            f"request body over {self.limit} bytes; send less, or raise BULKSYNC_API_MAX_BODY "
            "on the server"
        )
        await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)
