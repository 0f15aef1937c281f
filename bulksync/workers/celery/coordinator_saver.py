"""Checkpoints of graphs a node invokes on a worker, kept by the coordinator's saver.

A graph invoked inside a node function (``sub.invoke(...)`` in the node's code) runs where
the node runs. In-process it checkpoints through the run's saver, so its paused state shows
in ``get_state(subgraphs=True)`` and a resumed run picks it up where it paused. A worker has
no saver of the run's (the caller's ``InMemorySaver``, the service's fenced Postgres saver),
so it gets a ``CoordinatorSaver``: its writes (``put``, ``put_writes``) go to the step's inbox
and the coordinator applies them to the run's saver, in order, before the task's result
(which follows them in the same inbox); its reads (``get_tuple``, ``list``) are requests on
the inbox that the coordinator answers on a reply key the worker waits on.

Values cross as the wire's bytes (an ``Encoded`` value is not encoded again); what a read
returns is plain values, as from any saver. ``serve`` is the coordinator's side.
"""

from __future__ import annotations

import builtins
import dataclasses
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis

from bulksync import keys
from bulksync.checkpoint.base import (
    Checkpoint,
    CheckpointSaver,
    CheckpointTuple,
    Encoded,
    checkpoint_config,
    config_thread,
    stored_bytes,
)
from bulksync.checkpoint.serde import dumps_checkpoint, loads_checkpoint
from bulksync.errors import ConfigError
from bulksync.workers import wire

QUERY_WAIT = 60.0
"""Seconds a worker waits for the coordinator to answer a checkpoint read."""

REPLY_TTL = 120
"""Seconds an unread answer lives (its worker gave up waiting)."""


class CoordinatorSaver:
    """The saver of graphs invoked by one step's tasks on a worker: the coordinator's."""

    def __init__(self, client: redis.Redis, step_key: str) -> None:
        self.serde = wire.SERDE
        self.client = client
        self.step_key = step_key

    def get_tuple(self, config: Mapping[str, Any]) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (else the namespace's latest), from the run's saver."""
        found = self._ask(["get_tuple", dict(config)])
        return None if found is None else _loads_tuple(found)

    def list(
        self,
        config: Mapping[str, Any] | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, from the run's saver."""
        args = [None if config is None else dict(config), filter, before, limit]
        found: builtins.list[Any] = self._ask(["list", *args])
        return iter([_loads_tuple(t) for t in found])

    def put(
        self,
        config: Mapping[str, Any],
        checkpoint: Checkpoint,
        metadata: Mapping[str, Any],
        new_versions: Mapping[str, int],
    ) -> dict[str, Any]:
        """Send ``checkpoint`` to the run's saver; its config, as the saver will return it."""
        values = {k: stored_bytes(self.serde, v) for k, v in checkpoint.channel_values.items()}
        data = dumps_checkpoint(self.serde, checkpoint)
        self._send(["put", dict(config), data, values, dict(metadata), dict(new_versions)])
        thread_id, ns, _ = config_thread(config)
        return checkpoint_config(thread_id, ns, checkpoint.id)

    def put_writes(
        self,
        config: Mapping[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Send a task's writes to the run's saver."""
        encoded = [[channel, stored_bytes(self.serde, value)] for channel, value in writes]
        self._send(["put_writes", dict(config), encoded, task_id, task_path])

    def delete_thread(self, thread_id: str) -> None:
        """Not from a node: a thread is deleted by its owner, not by a task running in it."""
        raise ConfigError(
            f"a graph invoked inside a node cannot delete thread {thread_id!r}: delete it "
            "with the run's own checkpointer, outside the run"
        )

    def _send(self, call: builtins.list[Any]) -> None:
        self._report(wire.SAVE + wire.SERDE.dumps(call))

    def _ask(self, call: builtins.list[Any]) -> Any:
        reply_key = keys.reply(uuid.uuid4().hex)
        request = wire.QUERY + wire.SERDE.dumps([reply_key, *call])
        self._report(request)
        answer: Any = self.client.blpop([reply_key], timeout=QUERY_WAIT)
        if answer is None:
            raise TimeoutError(
                f"the coordinator did not answer a checkpoint read of step {self.step_key} "
                f"within {QUERY_WAIT:.0f}s (is it running, and the step still open?)"
            )
        ok, value = wire.SERDE.loads(answer[1])
        if not ok:
            raise wire.loads_error(value)
        return value

    def _report(self, entry: bytes) -> None:
        wire.report(self.client, self.step_key, entry)


def serve(saver: CheckpointSaver | None, client: redis.Redis, kind: bytes, data: bytes) -> None:
    """Apply a worker's checkpoint write (``wire.SAVE``), or answer its read (``QUERY``).

    Raises:
        Exception: what the saver raises on a write (a read's error goes to the worker).
    """
    call = wire.SERDE.loads(data)
    if kind == wire.SAVE:
        if saver is not None:  # without one the worker has none either (never sent)
            _write(saver, call)
        return
    reply_key, op, *args = call
    try:
        if saver is None:
            raise ConfigError("the run has no checkpointer")
        if op == "get_tuple":
            found = saver.get_tuple(args[0])
            answer: Any = None if found is None else _dumps_tuple(found)
        else:
            config, filter, before, limit = args
            listed = saver.list(config, filter=filter, before=before, limit=limit)
            answer = [_dumps_tuple(t) for t in listed]
        reply = wire.SERDE.dumps([True, answer])
    except Exception as exc:  # the worker's read fails with it
        reply = wire.SERDE.dumps([False, wire.dumps_error(exc)])
    pipe = client.pipeline(transaction=False)
    pipe.rpush(reply_key, reply)
    pipe.expire(reply_key, REPLY_TTL)
    pipe.execute()


def _write(saver: CheckpointSaver, call: builtins.list[Any]) -> None:
    op, config, *args = call
    if op == "put":
        data, values, metadata, new_versions = args
        checkpoint = loads_checkpoint(wire.SERDE, data)
        checkpoint = _with_values(
            checkpoint, {k: Encoded(v, wire.SERDE) for k, v in values.items()}
        )
        saver.put(config, checkpoint, metadata, new_versions)
    else:
        writes, task_id, task_path = args
        encoded = [(channel, Encoded(value, wire.SERDE)) for channel, value in writes]
        saver.put_writes(config, encoded, task_id, task_path)


def _with_values(checkpoint: Checkpoint, values: Mapping[str, Any]) -> Checkpoint:
    return dataclasses.replace(checkpoint, channel_values=values)


def _dumps_tuple(found: CheckpointTuple) -> builtins.list[Any]:
    checkpoint = found.checkpoint
    values = {k: stored_bytes(wire.SERDE, v) for k, v in checkpoint.channel_values.items()}
    writes = [[t, c, stored_bytes(wire.SERDE, v)] for t, c, v in found.pending_writes]
    return [
        found.config,
        dumps_checkpoint(wire.SERDE, checkpoint),
        values,
        found.metadata,
        found.parent_config,
        writes,
    ]


def _loads_tuple(data: Sequence[Any]) -> CheckpointTuple:
    config, checkpoint_data, values, metadata, parent_config, writes = data
    checkpoint = loads_checkpoint(wire.SERDE, checkpoint_data)
    plain = {k: wire.SERDE.loads(v) for k, v in values.items()}
    return CheckpointTuple(
        config,
        _with_values(checkpoint, plain),
        metadata,
        parent_config,
        tuple((t, c, wire.SERDE.loads(v)) for t, c, v in writes),
    )
