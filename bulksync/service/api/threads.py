"""``/threads``: create, read, search, change and delete threads; their state and history.

States and history are read here, from the checkpoints, with the thread's graph (loaded by
this process); an update of a thread's state is a run (``update_state``), which a
coordinator commits under the thread's lease like any other writer.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from starlette.concurrency import run_in_threadpool

from bulksync.errors import ConflictError
from bulksync.service import submit
from bulksync.service.api import encode
from bulksync.service.api.app import Backend, backend
from bulksync.service.api.assistants import graph_id_of
from bulksync.service.api.bodies import (
    CheckpointRef,
    HistoryQuery,
    StateAt,
    StateUpdate,
    ThreadCreate,
    ThreadPatch,
    ThreadSearch,
    thread_config,
)
from bulksync.service.threads import BUSY, Thread

router = APIRouter(tags=["threads"])
Server = Annotated[Backend, Depends(backend)]


@router.post("/threads")
async def create(server: Server, body: ThreadCreate) -> dict[str, Any]:
    """Create a thread; with ``supersteps``, apply them as its first checkpoints."""
    graph_id = (body.metadata or {}).get("graph_id")
    if graph_id is not None:
        graph_id = graph_id_of(server, str(graph_id))
    if body.supersteps and graph_id is None:
        raise ConflictError("supersteps need the thread's graph: pass metadata.graph_id")
    row = await run_in_threadpool(
        server.threads.create,
        body.thread_id,
        metadata=body.metadata,
        graph_id=graph_id,
        if_exists=body.if_exists,
    )
    if body.supersteps:
        steps = [
            [[u.get("values"), u.get("as_node"), None] for u in step.get("updates") or ()]
            for step in body.supersteps
        ]
        assert graph_id is not None
        await _update(server, row, graph_id, thread_config(row.thread_id), steps)
        row = await run_in_threadpool(server.thread, row.thread_id)
    return await run_in_threadpool(_record, server, row)


@router.get("/threads/{thread_id}")
def get(server: Server, thread_id: str) -> dict[str, Any]:
    """The thread, with its current values and interrupts."""
    return _record(server, server.thread(thread_id))


@router.patch("/threads/{thread_id}")
def update(server: Server, thread_id: str, body: ThreadPatch) -> dict[str, Any]:
    """Merge metadata into the thread's."""
    row = server.threads.update(thread_id, body.metadata)
    return _record(server, row if row is not None else server.thread(thread_id))


@router.delete("/threads/{thread_id}", status_code=204)
def delete(server: Server, thread_id: str) -> Response:
    """Delete the thread, its finished runs and its checkpoints (refused while it runs)."""
    row = server.thread(thread_id)
    if row.status == BUSY:
        raise ConflictError(
            f"thread '{thread_id}' has a run pending or running; cancel it first "
            f"(GET /threads/{thread_id}/runs lists them)"
        )
    server.saver.delete_thread(thread_id)
    server.threads.delete(thread_id)
    return Response(status_code=204)


@router.post("/threads/search")
def search(server: Server, body: ThreadSearch) -> list[dict[str, Any]]:
    """The threads matching every filter given, a page of them."""
    graph_id = None if body.graph_id is None else graph_id_of(server, body.graph_id)
    found = server.threads.search(
        metadata=body.metadata,
        status=body.status,
        ids=body.ids,
        graph_id=graph_id,
        limit=body.limit,
        offset=body.offset,
        sort_by=body.sort_by,
        sort_order=body.sort_order,
    )
    return [_record(server, row) for row in found]


@router.post("/threads/count")
def count(server: Server, body: ThreadSearch | None = None) -> int:
    """How many threads match every filter given."""
    body = body or ThreadSearch()
    return server.threads.count(metadata=body.metadata, status=body.status, ids=body.ids)


@router.get("/threads/{thread_id}/state")
def state(
    server: Server, thread_id: str, subgraphs: Annotated[bool, Query()] = False
) -> dict[str, Any]:
    """The thread's current state."""
    return _state(server, thread_id, thread_config(thread_id), subgraphs)


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
def state_at_id(
    server: Server,
    thread_id: str,
    checkpoint_id: str,
    subgraphs: Annotated[bool, Query()] = False,
) -> dict[str, Any]:
    """The thread's state at one of its checkpoints."""
    return _state(server, thread_id, thread_config(thread_id, None, checkpoint_id), subgraphs)


@router.post("/threads/{thread_id}/state/checkpoint")
def state_at(server: Server, thread_id: str, body: StateAt) -> dict[str, Any]:
    """The thread's state at a checkpoint (a subgraph's with ``checkpoint_ns``)."""
    return _state(server, thread_id, thread_config(thread_id, body.checkpoint), body.subgraphs)


@router.post("/threads/{thread_id}/state")
async def update_state(server: Server, thread_id: str, body: StateUpdate) -> dict[str, Any]:
    """Apply ``values`` as if ``as_node`` returned them; the new checkpoint."""
    row = await run_in_threadpool(server.thread, thread_id)
    if row.graph_id is None:
        raise ConflictError(
            f"thread '{thread_id}' has no graph yet: run it first, or create it with "
            "metadata.graph_id"
        )
    config = thread_config(thread_id, body.checkpoint, body.checkpoint_id)
    config = await _update(server, row, row.graph_id, config, [[[body.values, body.as_node, None]]])
    return {"checkpoint": encode.checkpoint(config), "configurable": config["configurable"]}


@router.post("/threads/{thread_id}/history")
def history(server: Server, thread_id: str, body: HistoryQuery) -> list[dict[str, Any]]:
    """The thread's checkpoints, newest first."""
    return _history(server, thread_id, body)


@router.get("/threads/{thread_id}/history")
def history_get(
    server: Server,
    thread_id: str,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10,
    before: Annotated[str | None, Query()] = None,
) -> list[dict[str, Any]]:
    """The thread's checkpoints, newest first (``before``: a checkpoint id)."""
    return _history(server, thread_id, HistoryQuery(limit=limit, before=before or None))


def _history(server: Backend, thread_id: str, body: HistoryQuery) -> list[dict[str, Any]]:
    graph = server.graph(server.thread(thread_id))
    if graph is None:
        return []
    before = body.before
    if isinstance(before, str):
        before = CheckpointRef(checkpoint_id=before)
    before_config = None if before is None else thread_config(thread_id, before)
    found = graph.get_state_history(
        thread_config(thread_id, body.checkpoint),
        filter=body.metadata,
        before=before_config,
        limit=body.limit,
    )
    return [encode.thread_state(snapshot) for snapshot in found]


def _state(
    server: Backend, thread_id: str, config: dict[str, Any], subgraphs: bool
) -> dict[str, Any]:
    graph = server.graph(server.thread(thread_id))
    if graph is None:
        return encode.empty_state()
    return encode.thread_state(graph.get_state(config, subgraphs=subgraphs))


def _record(server: Backend, row: Thread) -> dict[str, Any]:
    graph = server.graph(row) if row.graph_id in server.registry else None
    snapshot = None if graph is None else graph.get_state(thread_config(row.thread_id))
    return encode.thread(row, snapshot)


async def _update(
    server: Backend,
    row: Thread,
    graph_id: str,
    config: dict[str, Any],
    supersteps: list[list[list[Any]]],
) -> dict[str, Any]:
    """Apply ``supersteps`` of updates to the thread through an ``update_state`` run."""
    if row.status == BUSY:
        raise ConflictError(f"thread '{row.thread_id}' has a run pending or running; wait for it")
    payload = {"config": config, "options": {}, "supersteps": supersteps}
    run_id = await run_in_threadpool(
        submit.create_run,
        server.store,
        server.redis,
        graph_id,
        "update_state",
        payload,
        thread_id=row.thread_id,
        multitask_strategy="reject",
    )
    run = await server.finished(run_id)
    error = run.exception()
    if error is not None:
        raise error if isinstance(error, ValueError | LookupError) else ConflictError(str(error))
    result: dict[str, Any] = run.output
    return result
