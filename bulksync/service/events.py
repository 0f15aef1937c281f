"""A run's events and the coordinators' wake-ups, in Redis (the runs table is ``runs.py``).

A run's events go to the stream ``keys.events(run_id)`` (``add_event``), one entry each,
field ``d``: msgpack ``[namespace, mode, chunk]``. ``mode`` is a stream mode the run asked
for, ``progress`` (``{"step", "done", "total", "nodes", …}`` of the root graph's current
step) or, last, ``end`` (``end_event``), written after the row's final status. A
submission pushes to ``keys.WAKE`` (``wake``), where idle coordinators block; coordinators
announce the graphs they serve (``announce``, ``withdraw``, ``serving``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

import redis
from redis.typing import EncodableT, FieldT

from bulksync import keys
from bulksync.service.runs import Run
from bulksync.workers import wire

EVENT_FIELD: Final = b"d"
END: Final = "end"
PROGRESS: Final = "progress"
LIFECYCLE: Final = "graph_lifecycle"
"""Events of a run whose caller has lifecycle handlers: each pause and resumption."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunEvent:
    """One entry of a run's event stream; ``id`` resumes reading after it."""

    id: str
    namespace: tuple[str, ...]
    mode: str
    chunk: Any


def dumps_event(namespace: Sequence[str], mode: str, chunk: Any) -> dict[FieldT, EncodableT]:
    """The fields of a stream entry for one event."""
    if mode in _ERROR_MODES:
        chunk = _errors_out(chunk)
    return {EVENT_FIELD: wire.SERDE.dumps([list(namespace), mode, chunk])}


def loads_event(entry_id: Any, fields: Any) -> RunEvent:
    """Decode a stream entry (``(id, fields)`` as redis-py returns it) from ``dumps_event``."""
    namespace, mode, chunk = wire.SERDE.loads(fields[EVENT_FIELD])
    if mode in _ERROR_MODES:
        chunk = _errors_in(chunk)
    ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return RunEvent(ident, tuple(namespace), mode, chunk)


# The modes whose chunks carry a failed task's exception (``tasks``, ``debug`` task results,
# ``checkpoints`` task entries). wire.SERDE would store it as a StoredError; as an error record
# (``wire.dumps_error``) it comes back with its own type, as the run's final error does.
_ERROR_MODES: Final = frozenset({"tasks", "debug", "checkpoints"})
_ERROR_KEY: Final = "__bulksync_error__"


def _errors_out(value: Any) -> Any:
    """``value`` with every exception inside replaced by its error record."""
    if isinstance(value, BaseException):
        return {_ERROR_KEY: wire.dumps_error(value)}
    if type(value) is dict:  # exact types: a user's dict or tuple subclass is left alone
        return {k: _errors_out(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        items = [_errors_out(v) for v in value]
        return items if type(value) is list else tuple(items)
    return value


def _errors_in(value: Any) -> Any:
    """Undo ``_errors_out``: error records become exceptions again."""
    if type(value) is dict:
        record = value.get(_ERROR_KEY)
        if len(value) == 1 and isinstance(record, bytes):
            return wire.loads_error(record)
        return {k: _errors_in(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        items = [_errors_in(v) for v in value]
        return items if type(value) is list else tuple(items)
    return value


def add_event(
    client: redis.Redis,
    run_id: str,
    mode: str,
    chunk: Any,
    namespace: Sequence[str] = (),
    *,
    ttl: int,
) -> None:
    """Append an event to the run's stream (``keys.events``), which lives ``ttl`` s more.

    ``ttl`` is the ``run_ttl`` setting of the caller.
    """
    add_events(client, run_id, [(namespace, mode, chunk)], ttl=ttl)


def add_events(
    client: redis.Redis,
    run_id: str,
    batch: Sequence[tuple[Sequence[str], str, Any]],
    *,
    ttl: int,
    wake: bool = False,
) -> None:
    """Append ``(namespace, mode, chunk)`` events to the run's stream in order, in one
    round trip; the stream lives ``ttl`` s more. ``wake``: and wake a coordinator (a run's
    end may let the next run of its thread start), in the same round trip."""
    key = keys.events(run_id)
    pipe = client.pipeline(transaction=False)
    for namespace, mode, chunk in batch:
        pipe.xadd(key, dumps_event(namespace, mode, chunk))
    pipe.expire(key, ttl)
    if wake:
        _queue_wake(pipe)
    pipe.execute()


def wake(client: redis.Redis) -> None:
    """Tell a waiting coordinator there is work (``keys.WAKE``, kept short)."""
    pipe = client.pipeline(transaction=False)
    _queue_wake(pipe)
    pipe.execute()


def _queue_wake(pipe: Any) -> None:
    pipe.lpush(keys.WAKE, b"1")
    pipe.ltrim(keys.WAKE, 0, 999)


def announce(client: redis.Redis, graph_ids: Sequence[str], owner: str, ttl: float) -> None:
    """Say that ``owner`` serves ``graph_ids`` for the next ``ttl`` seconds (Redis's clock).

    A coordinator repeats this every heartbeat; one that dies simply stops, and its claim
    lapses after ``ttl``.
    """
    seconds, micros = client.time()
    until = seconds + micros / 1e6 + ttl
    pipe = client.pipeline(transaction=False)
    for graph_id in graph_ids:
        pipe.zadd(keys.served(graph_id), {owner: until})
        pipe.zremrangebyscore(keys.served(graph_id), "-inf", seconds)  # lapsed claims
    pipe.execute()


def withdraw(client: redis.Redis, graph_ids: Sequence[str], owner: str) -> None:
    """Say that ``owner`` no longer serves ``graph_ids`` (a coordinator stopping)."""
    pipe = client.pipeline(transaction=False)
    for graph_id in graph_ids:
        pipe.zrem(keys.served(graph_id), owner)
    pipe.execute()


# Claims that lapse after Redis's clock now, counted where that clock is read.
_SERVING_LUA = """local now = redis.call('TIME')
return redis.call('ZCOUNT', KEYS[1], now[1] .. '.' .. string.format('%06d', now[2]), '+inf')"""


def serving(client: redis.Redis, graph_id: str) -> int:
    """How many live coordinators serve ``graph_id`` now (one round trip)."""
    return int(client.eval(_SERVING_LUA, 1, keys.served(graph_id)))


END_ROW_LIMIT: Final = 64 * 1024
"""The largest payload and output, together, an ``end`` event carries its run's row with."""


def end_event(run: Run) -> dict[str, Any]:
    """The ``end`` event's chunk for a finished run: ``{"status", "error"}``, and ``"run"``,
    the whole final row, when its payload and output are small (``END_ROW_LIMIT``), so that
    a caller waiting for the end has the result without reading the row from Postgres."""
    chunk: dict[str, Any] = {"status": run.status, "error": run.error}
    if len(run.payload_bytes) + len(run.output_bytes or b"") <= END_ROW_LIMIT:
        chunk["run"] = {f.name: getattr(run, f.name) for f in dataclasses.fields(Run)}
    return chunk


def ended_run(chunk: Any, run_id: str) -> Run | None:
    """The final row of run ``run_id`` its ``end`` event's chunk carries, if it does."""
    row = chunk.get("run") if isinstance(chunk, Mapping) else None
    if not isinstance(row, Mapping) or row.get("run_id") != run_id:
        return None
    try:
        return Run(**row)
    except TypeError:  # written by a version whose rows have other columns: read the row
        return None
