"""The chunks a run streams, built from plain data (LangGraph's shapes, mode by mode).

``values``: the output keys after a step; ``updates``: ``{node: update}`` per finished task;
``tasks``: a task's start and result payloads; ``checkpoints``: the checkpoint a step plans
from; ``debug``: the last three wrapped with ``step``/``timestamp``/``type``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, get_args

from bulksync.channels.base import BaseChannel
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, ERROR, INTERRUPT, RETURN, START
from bulksync.coordinator.plan import Task, task_path_str
from bulksync.coordinator.spec import Write
from bulksync.coordinator.status import read_task_statuses
from bulksync.errors import ConfigError
from bulksync.types import Interrupt, StreamMode

Keys = Sequence[str] | str

ALL_MODES: tuple[StreamMode, ...] = get_args(StreamMode)
"""Every stream mode, from ``types.StreamMode``: what ``stream()`` and the CLI accept."""

PAUSES = "__pauses__"
"""bulksync's own mode: only the ``updates`` chunks that carry interrupts. ``invoke`` reads
these of the updates, so a run it makes builds no chunk per task for them."""

TASK_STEPS = "__task_steps__"
"""bulksync's own mode: the ``debug`` events of tasks alone (type, step, payload). The
coordinator service counts a run's tasks by them, without the checkpoint payload that
``debug`` builds every step."""


def check_modes(modes: Sequence[str]) -> None:
    """Raise ``ConfigError`` (a ``ValueError``) naming a stream mode that does not exist."""
    for mode in modes:
        if mode not in ALL_MODES and mode not in (PAUSES, TASK_STEPS):
            raise ConfigError(f"Unknown stream_mode {mode!r}; use one of {ALL_MODES}.")


def stream_modes(stream_mode: str | Sequence[str] | None, debug: bool) -> tuple[list[str], bool]:
    """The modes a ``stream()`` call asks for (``debug`` adds one), and whether its chunks
    come bare: one mode, asked for as a string (else they are framed with their mode).

    Raises:
        ConfigError: an unknown mode.
    """
    if stream_mode is None or isinstance(stream_mode, str):
        modes, single = [stream_mode or "updates"], True
    else:
        modes, single = list(stream_mode), False
    if debug and "debug" not in modes:
        modes.append("debug")
    check_modes(modes)
    return modes, single and len(modes) == 1


def frame(ns: tuple[str, ...], mode: str, chunk: Any, *, subgraphs: bool, bare: bool) -> Any:
    """A chunk as ``stream()`` yields it: with its namespace if ``subgraphs``, its mode unless
    ``bare``."""
    if subgraphs:
        return (ns, chunk) if bare else (ns, mode, chunk)
    return chunk if bare else (mode, chunk)


STREAM_VERSIONS = ("v1", "v2")
"""How ``stream``/``invoke`` frame their output: v1 tuples and dicts, or v2 typed parts."""


def check_version(version: str) -> None:
    """Raise ``ConfigError`` (a ``ValueError``) naming a stream ``version`` that does not exist."""
    if version not in STREAM_VERSIONS:
        raise ConfigError(f"Unknown version {version!r}; use one of {STREAM_VERSIONS}.")


def stream_part(
    ns: tuple[str, ...],
    mode: str,
    chunk: Any,
    *,
    output: Callable[[Any], Any] | None = None,
    state: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """A chunk as ``stream(..., version="v2")`` yields it: ``{"type", "ns", "data"}``.

    A ``values`` part moves the ``__interrupt__`` key of its chunk to ``interrupts`` and, with
    ``output``, gives the data as the output schema's instance; ``checkpoints`` and ``debug``
    parts give checkpoint values through ``state`` (not the first checkpoint's, which lacks
    keys the schema may require).
    """
    if mode == "values":
        interrupts: tuple[Interrupt, ...] = ()
        if isinstance(chunk, dict):
            chunk = dict(chunk)
            interrupts = tuple(chunk.pop(INTERRUPT, ()))
            if output is not None:
                chunk = output(chunk)
        return {"type": mode, "ns": ns, "data": chunk, "interrupts": interrupts}
    if mode in ("checkpoints", "debug") and state is not None and isinstance(chunk, dict):
        chunk = _with_state(chunk, state)
    return {"type": mode, "ns": ns, "data": chunk}


def _with_state(chunk: dict[str, Any], state: Callable[[Any], Any]) -> dict[str, Any]:
    """A checkpoint payload (or a debug event wrapping one) with its values through ``state``."""
    if chunk.get("type") == "checkpoint" and isinstance(chunk.get("payload"), dict):
        return {**chunk, "payload": _with_state(chunk["payload"], state)}
    values = chunk.get("values")
    if isinstance(values, dict) and START not in chunk.get("next", ()):
        return {**chunk, "values": state(values)}
    return chunk


def read_channels(channels: Mapping[str, BaseChannel[Any, Any]], keys: Keys) -> Any:
    """Values of ``keys`` that hold one (a single value for a str key; None if empty)."""
    if isinstance(keys, str):
        chan = channels.get(keys)
        return chan.get() if chan is not None and chan.is_available() else None
    return {k: channels[k].get() for k in keys if k in channels and channels[k].is_available()}


def wrote_any(writes: Sequence[Write], keys: Keys) -> bool:
    """Whether ``writes`` touch any of ``keys``."""
    wanted = {keys} if isinstance(keys, str) else set(keys)
    return any(chan in wanted for chan, _ in writes)


def is_hidden(task: Task) -> bool:
    """Tasks of hidden nodes (``__start__``) stream no updates; error handlers do."""
    return task.name.startswith("__") and "error_handler__" not in task.name


def update_chunk(task: Task, writes: Sequence[Write], keys: Keys, *, cached: bool) -> Any:
    """``{node: update}`` for one finished task (None when it wrote no output key)."""
    if isinstance(keys, str):
        values = [v for c, v in writes if c == keys]
        # one value as it is; several (a list of Commands) as the list, as LangGraph shows
        update: Any = values[0] if len(values) == 1 else (values or None)
    else:
        pairs = [(c, v) for c, v in writes if c in keys]
        counts = {c for c, _ in pairs}
        if not pairs:
            update = None
        elif len(counts) < len(pairs):
            update = [{c: v} for c, v in pairs]
        else:
            update = dict(pairs)
    chunk: dict[str, Any] = {task.name: update}
    if cached:
        chunk["__metadata__"] = {"cached": True}
    return chunk


def task_start(task: Task, user_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``tasks`` payload when a task starts."""
    payload = {"id": task.id, "name": task.name, "input": task.input, "triggers": task.triggers}
    if user_metadata:
        payload["metadata"] = dict(user_metadata)
    return payload


def result_writes(writes: Sequence[Write]) -> dict[str, Any]:
    """Fold writes into ``{channel: value}``, a channel written twice as ``{"$writes": [...]}``."""
    result: dict[str, Any] = {}
    for chan, value in writes:
        if chan in result:
            prev = result[chan]
            many = prev["$writes"] if isinstance(prev, dict) and "$writes" in prev else [prev]
            result[chan] = {"$writes": [*many, value]}
        else:
            result[chan] = value
    return result


def task_result(task: Task, writes: Sequence[Write], keys: Keys) -> dict[str, Any]:
    """The ``tasks`` payload when a task finishes (writes include its control writes)."""
    wanted = {keys} if isinstance(keys, str) else set(keys)
    return {
        "id": task.id,
        "name": task.name,
        "error": next((v for c, v in writes if c == ERROR), None),
        "result": result_writes([(c, v) for c, v in writes if c in wanted or c == RETURN]),
        "interrupts": [
            dataclasses.asdict(i) for c, v in writes if c == INTERRUPT for i in _interrupts(v)
        ],
    }


def _interrupts(value: Any) -> list[Interrupt]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def debug_event(mode: str, step: int, payload: Any) -> dict[str, Any]:
    """Wrap a ``tasks`` or ``checkpoints`` payload for the ``debug`` mode."""
    if mode == "checkpoints":
        kind = "checkpoint"
    else:
        kind = "task_result" if isinstance(payload, dict) and "result" in payload else "task"
    return {
        "step": step,
        "timestamp": datetime.now(UTC).isoformat(),
        "type": kind,
        "payload": payload,
    }


def task_path_key(task: Task) -> str:
    """The path a task's pending writes are sorted by."""
    return task_path_str(task.path)


def checkpoint_payload(
    config: Mapping[str, Any],
    parent_config: Mapping[str, Any] | None,
    values: Any,
    metadata: Mapping[str, Any],
    tasks: Sequence[Task],
    pending_writes: Sequence[tuple[str, str, Any]],
    keys: Keys,
    task_states: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``checkpoints`` payload for the checkpoint a step plans from (``task_states``:
    where a subgraph node's task keeps its checkpoints, by task id)."""
    statuses = read_task_statuses(w for w in pending_writes if w[0] in {t.id for t in tasks})
    wanted = {keys} if isinstance(keys, str) else set(keys)
    entries = []
    for task in tasks:
        status = statuses.get(task.id)
        entry: dict[str, Any] = {"id": task.id, "name": task.name}
        if status is not None and status.error is not None:
            entry["error"] = status.error
        else:
            result = [(c, v) for c, v in (status.output if status else ()) if c in wanted]
            if result:
                entry["result"] = result_writes(result)
            entry["interrupts"] = tuple(
                dataclasses.asdict(i) for i in (status.interrupts if status else ())
            )
        entry["state"] = (task_states or {}).get(task.id)
        entries.append(entry)
    mapped = with_checkpoint_map(config, metadata) or config
    parent = with_checkpoint_map(parent_config, metadata)
    return {
        "config": _public_config(mapped),
        "parent_config": _public_config(parent) if parent else None,
        "values": values,
        "metadata": dict(metadata),
        "next": [t.name for t in tasks],
        "tasks": entries,
    }


def with_checkpoint_map(
    config: Mapping[str, Any] | None, metadata: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The config as LangGraph shows it, naming the parent graphs' checkpoints."""
    if config is None:
        return None
    parents = metadata.get("parents")
    if not parents:
        return dict(config)
    conf = config["configurable"]
    return {
        **config,
        "configurable": {
            **conf,
            "checkpoint_map": {**parents, conf.get(CHECKPOINT_NS, ""): conf.get(CHECKPOINT_ID)},
        },
    }


def _public_config(config: Mapping[str, Any]) -> dict[str, Any]:
    conf = config.get("configurable") or {}
    return {"configurable": {k: v for k, v in conf.items() if not k.startswith("__")}}
