"""``/ok`` (the process answers: liveness), ``/health`` (Redis and Postgres answer too:
readiness) and ``/info`` (version and graphs)."""

from __future__ import annotations

from importlib import metadata
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from bulksync.service.api.app import Backend, backend
from bulksync.urls import redact

router = APIRouter(tags=["health"])
Server = Annotated[Backend, Depends(backend)]


@router.get("/ok")
def ok() -> dict[str, bool]:
    """The process answers (a liveness probe: it checks no service)."""
    return {"ok": True}


@router.get("/health")
async def health(server: Server) -> JSONResponse:
    """Whether Redis and Postgres answer (a readiness probe): 200, else 503 naming them."""
    checks: dict[str, str] = {}
    try:
        await server.streams.ping()
        checks["redis"] = "ok"
    except Exception as exc:  # any failure to answer is "not ready"
        checks["redis"] = f"cannot reach {redact(server.settings.redis_url)}: {exc}"
    try:
        await run_in_threadpool(_ping_postgres, server)
        checks["postgres"] = "ok"
    except Exception as exc:
        checks["postgres"] = f"cannot reach {redact(server.settings.database_url)}: {exc}"
    failing = [name for name, state in checks.items() if state != "ok"]
    if not failing:
        return JSONResponse(checks)
    detail = "; ".join(f"{name}: {checks[name]}" for name in failing)
    return JSONResponse({"detail": detail, **checks}, status_code=503)


def _ping_postgres(server: Backend) -> None:
    with server.saver.pool.connection(timeout=3) as conn:
        conn.execute("SELECT 1")


@router.get("/info")
def info(server: Server) -> dict[str, Any]:
    """The bulksync version and the graphs this server offers as assistants."""
    try:
        version = metadata.version("bulksync")
    except metadata.PackageNotFoundError:  # run from a tree that is not installed
        version = "unknown"
    return {"version": version, "graphs": server.registry.ids(), "flags": {}}
