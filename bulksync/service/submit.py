"""Queueing and cancelling runs: what ``Client`` and the HTTP API both do to the runs table.

A run goes in as a row of ``bulksync_runs`` (``RunStore.create``) with its payload, and a
coordinator is woken; a run that no live coordinator serves is refused unless asked for.
Cancelling marks the row, then either ends a pending run's stream or tells the running one's
tasks to stop (``cancel.cancel_run``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from bulksync.constants import THREAD_ID
from bulksync.errors import ConfigError, UnservedGraphError
from bulksync.service import events, runs
from bulksync.service.cancel import cancel_run
from bulksync.service.runs import Run, RunStore
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.cancel_scope import mark_async_caller


def create_run(
    store: RunStore,
    client: redis.Redis,
    graph_id: str,
    kind: str,
    payload: Mapping[str, Any],
    *,
    thread_id: str | None = None,
    multitask_strategy: str = "enqueue",
    require_coordinator: bool = True,
) -> str:
    """Queue a run of any kind (``runs.KINDS``) with its payload; return its id.

    The thread is ``thread_id``, else the payload config's, else a new one (written into
    the config).

    Raises:
        UnservedGraphError: no live coordinator serves ``graph_id`` and
            ``require_coordinator`` is set: nothing would ever run it.
        ConfigError: a graph or thread id holding a NUL byte, an unknown kind or strategy.
        ThreadBusyError: ``multitask_strategy="reject"`` and the thread has an active run.
        ThreadGraphError: the thread belongs to another graph (that of its first run).
    """
    payload = dict(payload)
    config = run_config(payload.get("config"))
    conf = config["configurable"]
    thread = thread_id or conf.get(THREAD_ID)
    if thread is None and kind in runs.READ_KINDS:
        thread = ""  # e.g. a history across threads: no thread to name
    elif thread is None:
        thread = str(uuid.uuid4())
    if thread:
        conf[THREAD_ID] = thread
    payload["config"] = config
    for name, value in (("graph_id", graph_id), ("thread_id", str(thread))):
        if "\x00" in value:  # Postgres text cannot hold it: say so before the database does
            raise ConfigError(
                f"{name} {value!r} contains a NUL byte, which the runs table cannot "
                f"store; pass a {name} without it."
            )
    if require_coordinator and not events.serving(client, graph_id):
        raise UnservedGraphError(
            f"no coordinator serves graph '{graph_id}': start one with "
            f"`bulksync coordinator --graph {graph_id.partition(':')[0]}` (it may "
            "take a heartbeat to announce itself), or queue the run anyway with "
            "require_coordinator=False (`--queue-anyway` on the command line)."
        )
    run = store.create(
        graph_id=graph_id,
        thread_id=str(thread),
        kind=kind,
        payload=payload,
        multitask_strategy=multitask_strategy,
    )
    events.wake(client)
    return run.run_id


def cancel(store: RunStore, client: redis.Redis, settings: Settings, run_id: str) -> Run:
    """Cancel a run: a pending one at once, a running one as soon as its tasks stop.

    Returns the run's row after the request (a finished run is left as it is).

    Raises:
        LookupError: no run has this id.
    """
    before, run = store.request_cancel(run_id)
    if before == runs.PENDING:  # no coordinator will write its end event
        events.add_event(client, run_id, events.END, events.end_event(run), ttl=settings.run_ttl)
    elif before == runs.RUNNING:
        cancel_run(client, run_id, settings)
    return run


def run_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parts of a config that travel with a run (live objects such as callbacks stay)."""
    kept = {k: v for k, v in (config or {}).items() if k in wire.CONFIG_KEYS and k != "run_id"}
    kept["configurable"] = dict(kept.get("configurable") or {})
    mark_async_caller(kept["configurable"])
    return kept


def run_options(
    output_keys: Sequence[str] | str | None,
    interrupt_before: Sequence[str] | str | None,
    interrupt_after: Sequence[str] | str | None,
    durability: str | None,
    context: Any,
) -> dict[str, Any]:
    """A run's options, by the names ``stream``/``invoke`` take them."""
    return {
        "output_keys": output_keys,
        "interrupt_before": interrupt_before,
        "interrupt_after": interrupt_after,
        "durability": durability,
        "context": context,
    }


def run_payload(
    input: Any,
    config: Mapping[str, Any] | None,
    modes: list[str],
    subgraphs: bool,
    options: Mapping[str, Any],
    asked: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The payload of an ``invoke``/``stream`` run; ``asked``: what its caller's callback
    handlers want reported (``trace``, ``lifecycle``)."""
    return {
        "input": input,
        "config": run_config(config),
        "stream_mode": modes,
        "subgraphs": subgraphs,
        "options": dict(options),
        **(asked or {}),
    }
