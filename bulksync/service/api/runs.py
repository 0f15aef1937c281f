"""``/threads/{id}/runs`` and ``/runs``: start runs, stream and wait for them, cancel them.

A run is queued for the coordinators as ``Client.create_run`` queues it (kind ``stream``,
with the modes asked for), on its thread — created first when the body says
``if_not_exists: "create"``, or a new one for ``/runs`` (deleted after the run unless
``on_completion: "keep"``). Its events come from its Redis stream (``streaming``), so a
dropped stream resumes from ``Last-Event-ID`` and any number of clients may follow one run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from bulksync.errors import ConfigError, ConflictError
from bulksync.service import events, runs, submit
from bulksync.service.api import encode, streaming
from bulksync.service.api.app import Backend, backend
from bulksync.service.api.assistants import graph_id_of
from bulksync.service.api.bodies import MODE_ALIASES, RunCreate, thread_config
from bulksync.service.runs import Run

router = APIRouter(tags=["runs"])
Server = Annotated[Backend, Depends(backend)]

KEEP_ALIVE: Final = 5.0
"""Seconds between the newlines a long wait sends, so no proxy or client times it out."""
LISTED_KINDS: Final = ("invoke", "stream")
"""The runs a thread lists: its graph's runs (updates of its state are not)."""


class _Started:
    """A run just queued, and what its response needs."""

    def __init__(self, run_id: str, thread_id: str, modes: list[str], threadless: bool) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        self.modes = modes
        self.threadless = threadless

    def headers(self, suffix: str = "") -> dict[str, str]:
        """``Content-Location`` (the run), and ``Location`` to resume from (``suffix``)."""
        path = f"/runs/{self.run_id}" if self.threadless else self.path
        found = {"Content-Location": path}
        if suffix and not self.threadless:
            found["Location"] = f"{self.path}/{suffix}"
        return found

    @property
    def path(self) -> str:
        return f"/threads/{self.thread_id}/runs/{self.run_id}"


def _start(server: Backend, thread_id: str | None, body: RunCreate) -> _Started:
    """Queue the run ``body`` asks for on ``thread_id`` (None: a new thread)."""
    graph_id = graph_id_of(server, body.assistant_id)
    modes = body.modes()
    threadless = thread_id is None
    # A thread the run names is created with the run (RunStore.create adds its row, and
    # refuses a thread of another graph).
    if thread_id is None:
        if body.command is not None and body.command.resume is not None:
            raise ConfigError("command.resume needs a thread with an interrupt: pass its id")
        thread_id = str(uuid.uuid4())
    else:
        row = server.threads.get(thread_id)
        if row is None and body.if_not_exists != "create":
            raise LookupError(
                f"no thread '{thread_id}'; create it first, or pass if_not_exists='create'"
            )
    run_id = submit.create_run(
        server.store,
        server.redis,
        graph_id,
        "stream",
        body.payload(thread_id, modes),
        thread_id=thread_id,
        multitask_strategy=body.multitask_strategy,
    )
    return _Started(run_id, thread_id, modes, threadless)


def _finish_threadless(server: Backend, started: _Started, body: RunCreate) -> None:
    """Delete a threadless run's thread after it, unless the body keeps it."""
    if started.threadless and (body.on_completion or "delete") == "delete":
        server.saver.delete_thread(started.thread_id)
        server.threads.delete(started.thread_id)


def _run_of(server: Backend, thread_id: str, run_id: str) -> Run:
    run = server.store.get(run_id)
    if run is None or run.thread_id != thread_id:
        raise LookupError(f"no run '{run_id}' on thread '{thread_id}'")
    return run


async def _result(server: Backend, run: Run) -> Any:
    """What ``wait`` and ``join`` answer for a finished run: its output values, or
    ``{"__error__": {...}}`` when it failed (a cancelled run: the thread's values)."""
    if run.status == runs.CANCELLED:
        row = await run_in_threadpool(server.threads.get, run.thread_id)
        graph = None if row is None else await run_in_threadpool(server.graph, row)
        if graph is None:
            return {}
        snapshot = await run_in_threadpool(graph.get_state, thread_config(run.thread_id))
        return encode.jsonable(snapshot.values)
    if run.status in runs.FAILED:
        return {"__error__": encode.run_error(run)}
    output = run.output
    return {} if output is None else encode.jsonable(output)


def _waiting(server: Backend, run_id: str, after: Any = None) -> AsyncIterator[bytes]:
    """The body of a wait: newlines while the run goes on, then its result as JSON."""

    async def body() -> AsyncIterator[bytes]:
        done = asyncio.ensure_future(server.finished(run_id))
        try:
            while not (await asyncio.wait({done}, timeout=KEEP_ALIVE))[0]:
                yield b"\n"
            run = done.result()
            result = await _result(server, run)
            if after is not None:
                await run_in_threadpool(after)
            yield streaming.dumps(result).encode()
        finally:
            done.cancel()

    return body()


def _streaming(
    server: Backend,
    started: _Started,
    *,
    after: str = "0",
    modes: list[str] | None = None,
    metadata: bool = True,
    cancel_on_disconnect: bool = False,
    then: Any = None,
) -> AsyncIterator[dict[str, Any]]:
    """The run's server-sent events; a client leaving cancels the run when it asked to."""

    async def body() -> AsyncIterator[dict[str, Any]]:
        ended = False
        run_id = started.run_id
        try:
            async for event in streaming.sse(
                server.events(run_id, after),
                run_id,
                lambda: server.row(run_id),
                started.modes if modes is None else modes,
                metadata=metadata,
            ):
                yield event
            ended = True
            if then is not None:
                await run_in_threadpool(then)
        finally:
            if not ended and cancel_on_disconnect:  # not awaited: the request is gone
                asyncio.get_running_loop().run_in_executor(
                    None, submit.cancel, server.store, server.redis, server.settings, run_id
                )

    return body()


# -- on a thread ----------------------------------------------------------------------------


@router.post("/threads/{thread_id}/runs")
async def create(server: Server, thread_id: str, body: RunCreate) -> JSONResponse:
    """Queue a run on the thread; answer at once with the run."""
    started = await run_in_threadpool(_start, server, thread_id, body)
    run = await server.row(started.run_id)
    return JSONResponse(encode.run(run), headers=started.headers())


@router.post("/threads/{thread_id}/runs/stream")
async def stream(server: Server, thread_id: str, body: RunCreate) -> EventSourceResponse:
    """Queue a run on the thread and stream its events as they come."""
    started = await run_in_threadpool(_start, server, thread_id, body)
    parts = _streaming(server, started, cancel_on_disconnect=body.on_disconnect == "cancel")
    return EventSourceResponse(parts, headers=started.headers("stream"))


@router.post("/threads/{thread_id}/runs/wait")
async def wait(server: Server, thread_id: str, body: RunCreate) -> StreamingResponse:
    """Queue a run on the thread and answer with its output once it has finished."""
    started = await run_in_threadpool(_start, server, thread_id, body)
    return StreamingResponse(
        _waiting(server, started.run_id),
        media_type="application/json",
        headers=started.headers("join"),
    )


@router.get("/threads/{thread_id}/runs")
def list_runs(
    server: Server,
    thread_id: str,
    limit: Annotated[int, Query(ge=0, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
    status: Annotated[str | None, Query()] = None,
) -> list[dict[str, Any]]:
    """The thread's runs, newest first."""
    server.thread(thread_id)
    found = server.store.list(
        thread_id=thread_id, status=status, limit=limit, offset=offset, kinds=LISTED_KINDS
    )
    return [encode.run(run) for run in found]


@router.get("/threads/{thread_id}/runs/{run_id}")
def get(server: Server, thread_id: str, run_id: str) -> dict[str, Any]:
    """The run."""
    return encode.run(_run_of(server, thread_id, run_id))


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
def delete(server: Server, thread_id: str, run_id: str) -> Response:
    """Forget a finished run (refused while it runs: cancel it first)."""
    run = _run_of(server, thread_id, run_id)
    if not run.finished:
        raise ConflictError(f"run '{run_id}' is {run.status}; cancel it first")
    server.store.delete(run_id)
    return Response(status_code=204)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", response_model=None)
async def cancel(
    server: Server,
    thread_id: str,
    run_id: str,
    wait: Annotated[str, Query()] = "false",
    action: Annotated[str, Query()] = "interrupt",
) -> Response:
    """Cancel the run: a pending one at once, a running one once its tasks stop."""
    if action != "interrupt":
        raise ConfigError(f"action={action!r}: bulksync cancels with 'interrupt' only")
    await run_in_threadpool(_run_of, server, thread_id, run_id)
    await run_in_threadpool(submit.cancel, server.store, server.redis, server.settings, run_id)
    if wait.lower() not in ("1", "true", "yes"):
        return Response(status_code=202)
    return StreamingResponse(_waiting(server, run_id), media_type="application/json")


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join(server: Server, thread_id: str, run_id: str) -> StreamingResponse:
    """Wait for the run; answer with its output once it has finished."""
    await run_in_threadpool(_run_of, server, thread_id, run_id)
    return StreamingResponse(_waiting(server, run_id), media_type="application/json")


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_stream(
    server: Server,
    thread_id: str,
    run_id: str,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    cancel_on_disconnect: Annotated[bool, Query()] = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """The run's events from its start, or after ``Last-Event-ID`` (a dropped stream)."""
    run = await run_in_threadpool(_run_of, server, thread_id, run_id)
    asked = [m for m in stream_mode or () if m]
    modes = list(dict.fromkeys(MODE_ALIASES.get(m, m) for m in asked)) or None
    started = _Started(run.run_id, run.thread_id, run.payload.get("stream_mode") or [], False)
    parts = _streaming(
        server,
        started,
        after=last_event_id or "0",
        modes=modes,
        metadata=not last_event_id,
        cancel_on_disconnect=cancel_on_disconnect,
    )
    return EventSourceResponse(parts, headers=started.headers())


# -- without a thread --------------------------------------------------------------------------


@router.post("/runs")
async def create_threadless(server: Server, body: RunCreate) -> JSONResponse:
    """Queue a run on a new thread (kept: there is no end to delete it at)."""
    started = await run_in_threadpool(_start, server, None, body)
    run = await server.row(started.run_id)
    return JSONResponse(encode.run(run), headers=started.headers())


@router.post("/runs/stream")
async def stream_threadless(server: Server, body: RunCreate) -> EventSourceResponse:
    """Run on a new thread and stream its events; the thread is deleted after the run
    unless ``on_completion`` is ``keep``."""
    started = await run_in_threadpool(_start, server, None, body)
    parts = _streaming(
        server,
        started,
        cancel_on_disconnect=body.on_disconnect == "cancel",
        then=lambda: _finish_threadless(server, started, body),
    )
    return EventSourceResponse(parts, headers=started.headers())


@router.post("/runs/wait")
async def wait_threadless(server: Server, body: RunCreate) -> StreamingResponse:
    """Run on a new thread and answer with its output; the thread is deleted after the run
    unless ``on_completion`` is ``keep``."""
    started = await run_in_threadpool(_start, server, None, body)
    return StreamingResponse(
        _waiting(server, started.run_id, lambda: _finish_threadless(server, started, body)),
        media_type="application/json",
        headers=started.headers(),
    )


# -- every run of a thread ---------------------------------------------------------------------


@router.get("/threads/{thread_id}/stream")
async def thread_stream(
    server: Server,
    thread_id: str,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """The events of the thread's runs as they come, one run after the other, each ended by
    ``metadata`` ``{"status": "run_done", "run_id"}``: the runs active or queued when the
    request came and every later one (or those after ``Last-Event-ID``), until the client
    leaves."""
    await run_in_threadpool(server.thread, thread_id)
    # Taken before answering, so a run queued once the client has the answer's headers is
    # streamed even if it ends before the stream first looks.
    found = await run_in_threadpool(_runs_of, server, thread_id)
    done = set() if last_event_id else {run.run_id for run in found if run.finished}
    return EventSourceResponse(_thread_events(server, thread_id, last_event_id, done))


def _runs_of(server: Backend, thread_id: str) -> list[Run]:
    """The thread's latest runs, oldest first."""
    return server.store.list(thread_id=thread_id, limit=50, kinds=LISTED_KINDS)[::-1]


async def _thread_events(
    server: Backend, thread_id: str, last_event_id: str | None, seen: set[str]
) -> AsyncIterator[dict[str, Any]]:
    """Follows the thread's runs but ``seen``; an event's id is ``<run id>:<its stream id>``."""
    run_id, _, after = (last_event_id or "").partition(":")
    while True:
        found = await run_in_threadpool(_runs_of, server, thread_id)
        queue = [run for run in found if run.run_id not in seen]
        if run_id:  # resuming: the runs up to the one the client was reading are done
            ids = [run.run_id for run in queue]
            if run_id in ids:
                queue = queue[ids.index(run_id) :]
        if not queue:
            await asyncio.sleep(server.settings.stream_wait)
            continue
        for run in queue:
            start = after if run.run_id == run_id else "0"
            async for event in server.events(run.run_id, start):
                if event.mode == events.END:
                    done = {"status": "run_done", "run_id": run.run_id}
                    ident = f"{run.run_id}:{event.id}"
                    yield {"event": "metadata", "data": streaming.dumps(done), "id": ident}
                elif streaming.wanted(event, None):
                    data = streaming.dumps(encode.jsonable(event.chunk))
                    name = streaming.event_name(event)
                    yield {"event": name, "data": data, "id": f"{run.run_id}:{event.id}"}
            seen.add(run.run_id)
        run_id = after = ""
