"""``/ui``: a live view of the runs in the browser, served by ``bulksync api`` itself.

Flower shows Celery's tasks one by one; this shows a run as its graph: the list of recent
runs (``/ui``), and a run's page (``/ui/runs/{run_id}``) that draws the graph of
``get_graph()`` and fills each node with its live task counts — queued, running, done,
failed — from the run's ``progress`` events, with a table of its steps, its interrupts and
its final output.

The pages are static files (HTML, vanilla JavaScript and CSS under ``static/``, no network
beyond this server) and carry no data, so they are served without a key; their scripts read
everything through the API with the ``x-api-key`` the user gives (kept in the browser's
``localStorage``): the run list and one run here under ``/ui/api``, the graph, the run's
events (``/threads/{id}/runs/{id}/stream``) and its output (``.../join``) at their usual
routes.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query
from fastapi.responses import FileResponse, HTMLResponse
from starlette.concurrency import run_in_threadpool

from bulksync.service.api import encode
from bulksync.service.api.app import Backend, backend
from bulksync.service.api.runs import LISTED_KINDS
from bulksync.service.runs import Run

router = APIRouter(tags=["ui"])
Server = Annotated[Backend, Depends(backend)]

STATIC: Final = Path(__file__).with_name("static")
"""The pages, scripts and style sheet (package data)."""

_ASSET: Final = re.compile(r"[a-z][a-z0-9_-]*\.(js|css)")
_MEDIA: Final = {"js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}
# The files change with the package only, but a browser holding an old script next to a new
# page shows nonsense: it asks again each time (a 304 when nothing changed).
_NO_STALE: Final = {"Cache-Control": "no-cache"}


def record(row: Run, now: datetime.datetime | None = None) -> dict[str, Any]:
    """The run's ``Run`` record plus ``duration_s``: how long it took when finished, how
    long since it was queued otherwise."""
    end = row.updated_at if row.finished else (now or datetime.datetime.now(datetime.UTC))
    seconds = max(0.0, (end - row.created_at).total_seconds())
    return {**encode.run(row), "duration_s": round(seconds, 3)}


def _page(name: str) -> HTMLResponse:
    return HTMLResponse((STATIC / name).read_text(encoding="utf-8"), headers=_NO_STALE)


@router.get("/ui", response_class=HTMLResponse)
def runs_page() -> HTMLResponse:
    """The list of recent runs (HTML; its script reads ``/ui/api/runs``)."""
    return _page("runs.html")


@router.get("/ui/runs/{run_id}", response_class=HTMLResponse)
def run_page(run_id: str) -> HTMLResponse:
    """One run's live view (HTML; its script finds the run by the id in the address)."""
    return _page("run.html")


@router.get("/ui/static/{name}")
def asset(name: str) -> FileResponse:
    """A script or style sheet of the pages."""
    match = _ASSET.fullmatch(name)
    path = STATIC / name
    if match is None or not path.is_file():
        raise LookupError(f"no file '{name}' in the run view's static files")
    return FileResponse(path, media_type=_MEDIA[match.group(1)], headers=_NO_STALE)


@router.get("/ui/api/runs")
def list_runs(
    server: Server,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    status: Annotated[str | None, Query()] = None,
) -> list[dict[str, Any]]:
    """Recent runs of every thread, newest first, optionally of one (bulksync) status."""
    found = server.store.list(status=status or None, limit=limit, kinds=LISTED_KINDS)
    now = datetime.datetime.now(datetime.UTC)
    return [record(row, now) for row in found]


@router.get("/ui/api/runs/{run_id}")
async def get_run(server: Server, run_id: str) -> dict[str, Any]:
    """One run, found by its id alone (the run page's address has no thread)."""
    row = await server.row(run_id)
    return await run_in_threadpool(record, row)
