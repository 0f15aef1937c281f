"""A run's events for HTTP clients: read from its Redis stream without a thread per client.

``follow`` reads ``keys.events(run_id)`` with ``XREAD BLOCK`` on the asyncio Redis client,
from any event id (``Last-Event-ID`` resumes a dropped stream), until the run's ``end``
event; between two blocks it checks the run's row, so a run whose end event was lost still
ends. ``sse`` turns the events into the Agent Server's server-sent events: ``metadata``
first, then one event per chunk named after its mode (``mode|ns…`` for a subgraph's), each
with its stream id, and ``error`` when the run failed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, Final

import redis.asyncio as aredis

from bulksync import keys
from bulksync.service import events, runs
from bulksync.service.api import encode
from bulksync.service.events import RunEvent
from bulksync.service.runs import Run
from bulksync.workers.callback_relay import CALLBACK_EVENTS

# Events of a run that are for bulksync's own clients, never an HTTP client's stream modes.
_PRIVATE: Final = frozenset({events.PROGRESS, events.LIFECYCLE, CALLBACK_EVENTS})


async def follow(
    client: aredis.Redis,
    run_id: str,
    after: str,
    row: Callable[[], Awaitable[Run]],
    block_ms: int,
) -> AsyncIterator[RunEvent]:
    """The run's events after ``after`` ("0": all) up to and including its end event.

    ``row`` reads the run's row (to tell a finished run whose end event is missing).
    """
    key = keys.events(run_id)
    finished = False
    while True:
        reply: Any = await client.xread(
            {key: after}, count=500, block=None if finished else block_ms
        )
        if reply:
            for entry_id, fields in reply[0][1]:
                event = events.loads_event(entry_id, fields)
                after = event.id
                yield event
                if event.mode == events.END:
                    return
        elif not finished:
            finished = (await row()).finished  # then drain what is left
        else:  # finished and drained, but no end event (expired, or its writer died)
            yield RunEvent(after, (), events.END, events.end_event(await row()))
            return


def event_name(event: RunEvent) -> str:
    """The SSE event name of a chunk: its mode, then its namespace's parts after ``|``."""
    return "|".join((event.mode, *event.namespace))


def wanted(event: RunEvent, modes: Collection[str] | None) -> bool:
    """Whether a client that asked for ``modes`` (None: all the run streams) gets ``event``.

    ``progress`` (a step's task counts, per node too: what the run view draws) only when
    asked for by name; the run's other bookkeeping events never.
    """
    if event.mode == events.PROGRESS:
        return modes is not None and events.PROGRESS in modes
    if event.mode in _PRIVATE:
        return False
    return not modes or event.mode in modes


async def sse(
    source: AsyncIterator[RunEvent],
    run_id: str,
    row: Callable[[], Awaitable[Run]],
    modes: Collection[str] | None = None,
    *,
    metadata: bool = True,
) -> AsyncIterator[dict[str, Any]]:
    """Server-sent events (``sse-starlette``'s dicts) for the run's events from ``source``."""
    if metadata:
        yield {"event": "metadata", "data": json.dumps({"run_id": run_id, "attempt": 1})}
    async for event in source:
        if event.mode == events.END:
            final = await row()
            if final.status in runs.FAILED:
                yield {"event": "error", "data": dumps(encode.run_error(final)), "id": event.id}
            return
        if wanted(event, modes):
            data = dumps(encode.jsonable(event.chunk))
            yield {"event": event_name(event), "data": data, "id": event.id}


def dumps(value: Any) -> str:
    """Compact JSON text (non-ASCII kept as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
