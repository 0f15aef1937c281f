"""bulksync's values as the JSON LangGraph's Agent Server sends: states, runs, threads, graphs.

Everything a run or a thread holds is a Python value (msgpack in storage); clients of the
HTTP API get JSON. ``jsonable`` maps the values graphs hold — LangChain messages and other
pydantic models (``model_dump``), dataclasses, ``Interrupt`` (``{"value", "id"}``), sets,
datetimes, errors — to JSON's types; the other functions build the Agent Server's records
(``ThreadState``, ``Checkpoint``, ``Run``, ``Thread``, ``Assistant``, the graph drawing).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import uuid
from collections.abc import Mapping
from typing import Any, Final

from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, THREAD_ID
from bulksync.errors import error_text
from bulksync.service import runs
from bulksync.service.runs import Run
from bulksync.service.threads import Thread
from bulksync.types import Interrupt, Send, StateSnapshot

ASSISTANT_NAMESPACE: Final = uuid.NAMESPACE_URL
"""An assistant's id is uuid5 of its graph id in this namespace, as the Agent Server's are."""

# The Agent Server's run statuses have no "cancelled": a cancelled run was interrupted.
_RUN_STATUS: Final = {runs.CANCELLED: "interrupted"}
# What a client may read of a run's payload (its input and options), as ``kwargs``.
_KWARGS: Final = ("input", "stream_mode", "subgraphs", "options", "config")


def jsonable(value: Any) -> Any:
    """``value`` with every part JSON cannot hold as its JSON form (see the module)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Interrupt):
        return interrupt(value)
    if isinstance(value, Send):
        return {"node": value.node, "arg": jsonable(value.arg)}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, BaseException):
        return {"error": type(value).__name__, "message": error_text(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):  # pydantic v2: LangChain's messages
        return jsonable(dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return repr(value)


def interrupt(value: Interrupt) -> dict[str, Any]:
    """An interrupt as LangGraph's clients build one again (``Interrupt(**record)``)."""
    record = {"value": jsonable(value.value), "id": value.id}
    if value.response_schema is not None:
        record["response_schema"] = jsonable(value.response_schema)
    return record


def checkpoint(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Agent Server's ``Checkpoint`` record of a checkpoint's config."""
    if not config:
        return None
    conf = config.get("configurable") or {}
    record = {
        "thread_id": conf.get(THREAD_ID),
        "checkpoint_ns": conf.get(CHECKPOINT_NS, ""),
        "checkpoint_id": conf.get(CHECKPOINT_ID),
    }
    if conf.get("checkpoint_map"):  # a subgraph's: the checkpoint of each enclosing graph
        record["checkpoint_map"] = jsonable(conf["checkpoint_map"])
    return record


def thread_state(snapshot: StateSnapshot) -> dict[str, Any]:
    """A ``StateSnapshot`` as the Agent Server's ``ThreadState``."""
    point = checkpoint(snapshot.config)
    parent = checkpoint(snapshot.parent_config)
    return {
        "values": jsonable(snapshot.values),
        "next": list(snapshot.next),
        "checkpoint": point,
        "metadata": jsonable(snapshot.metadata or {}),
        "created_at": snapshot.created_at,
        "parent_checkpoint": parent,
        "tasks": [_task(task) for task in snapshot.tasks],
        "interrupts": [interrupt(i) for i in snapshot.interrupts],
        "checkpoint_id": point["checkpoint_id"] if point else None,
        "parent_checkpoint_id": parent["checkpoint_id"] if parent else None,
    }


def empty_state() -> dict[str, Any]:
    """The state of a thread that has no checkpoint yet (as the Agent Server reports it)."""
    return {
        "values": {},
        "next": [],
        "checkpoint": None,
        "metadata": None,
        "created_at": None,
        "parent_checkpoint": None,
        "tasks": [],
        "interrupts": [],
    }


def _task(task: Any) -> dict[str, Any]:
    state = task.state
    return {
        "id": task.id,
        "name": task.name,
        "path": jsonable(task.path),
        "error": None if task.error is None else _error_message(task.error),
        "interrupts": [interrupt(i) for i in task.interrupts],
        "checkpoint": checkpoint(state) if isinstance(state, Mapping) else None,
        "state": thread_state(state) if isinstance(state, StateSnapshot) else None,
        "result": jsonable(task.result),
    }


def _error_message(error: Any) -> str:
    return error_text(error) if isinstance(error, BaseException) else str(error)


def assistant_id(graph_id: str) -> str:
    """The id of the assistant standing for ``graph_id``."""
    return str(uuid.uuid5(ASSISTANT_NAMESPACE, graph_id))


def assistant(graph_id: str, started: datetime.datetime) -> dict[str, Any]:
    """The Agent Server's ``Assistant`` record of a loaded graph."""
    when = started.isoformat()
    return {
        "assistant_id": assistant_id(graph_id),
        "graph_id": graph_id,
        "name": graph_id,
        "description": None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": when,
        "updated_at": when,
    }


def run(row: Run) -> dict[str, Any]:
    """The Agent Server's ``Run`` record of a row of the runs table."""
    payload = row.payload
    return {
        "run_id": row.run_id,
        "thread_id": row.thread_id,
        "assistant_id": assistant_id(row.graph_id),
        "graph_id": row.graph_id,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "status": _RUN_STATUS.get(row.status, row.status),
        "bulksync_status": row.status,
        "metadata": jsonable(payload.get("metadata") or {}),
        "multitask_strategy": row.multitask_strategy,
        "error": row.error,
        "kwargs": jsonable({k: payload.get(k) for k in _KWARGS if k in payload}),
    }


def thread(row: Thread, state: StateSnapshot | None) -> dict[str, Any]:
    """The Agent Server's ``Thread`` record: the row, with the values and interrupts of its
    current state where the graph is loaded here."""
    interrupts: dict[str, list[dict[str, Any]]] = {}
    if state is not None:
        for task in state.tasks:
            if task.interrupts:
                interrupts[task.id] = [interrupt(i) for i in task.interrupts]
    return {
        "thread_id": row.thread_id,
        "graph_id": row.graph_id,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "metadata": jsonable(row.metadata),
        "status": row.status,
        "values": None if state is None else jsonable(state.values),
        "interrupts": interrupts,
    }


def graph(drawing: Any) -> dict[str, Any]:
    """A ``DrawableGraph`` as the JSON ``get_graph`` returns (LangChain's ``to_json`` shape)."""
    nodes = []
    for name in drawing.nodes:
        node: dict[str, Any] = {
            "id": name,
            "type": "schema" if name in ("__start__", "__end__") else "runnable",
            "data": {"name": name},
        }
        if drawing.metadata.get(name):
            node["metadata"] = jsonable(drawing.metadata[name])
        nodes.append(node)
    edges = []
    for edge in drawing.edges:
        record: dict[str, Any] = {"source": edge.source, "target": edge.target}
        if edge.label is not None:
            record["data"] = edge.label
        if edge.conditional:
            record["conditional"] = True
        edges.append(record)
    return {"nodes": nodes, "edges": edges}


def run_error(row: Run) -> dict[str, Any]:
    """A failed run's error as the Agent Server reports it: ``{"error", "message"}``."""
    error = row.exception()
    if error is None:
        return {"error": "Error", "message": row.error or f"run ended {row.status}"}
    return {"error": type(error).__name__, "message": row.error or error_text(error)}
