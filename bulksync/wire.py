"""What crosses between a coordinator and its workers, and how it is encoded.

Three records travel, all msgpack through the checkpoint serde (so the same explicit type
registry guards them, and nothing is unpickled):

- a **step state** (the claim check): the step's channel values, the run's config, resume
  answers and namespace, put into Redis once per step;
- a **task descriptor**: a task's id, node, path, triggers, step and namespace, carried in the
  Celery message (plain msgpack, a few hundred bytes); its input sits in the step hash;
- a **task result**: writes, interrupts, or an error, pushed to the step's inbox.

Errors keep their type when the class is loaded in the reading process (the worker and the
coordinator load the same graph modules); otherwise they arrive as ``StoredError`` naming
the type. Either way the traceback of where it was raised is attached as a note.
"""

from __future__ import annotations

import dataclasses
import hashlib
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from bulksync.channels.base import MISSING
from bulksync.checkpoint.base import Serde
from bulksync.checkpoint.serde import MsgpackSerde, StoredError, dumps_for, lookup_loaded, type_ref
from bulksync.coordinator.executor import TaskResult
from bulksync.coordinator.plan import Task
from bulksync.errors import SerializationError, describe_type
from bulksync.types import Interrupt

SERDE: Serde = MsgpackSerde()
"""The serde of every wire record (it resolves user types registered with ``register_type``)."""

# Config keys that mean something to a node; callbacks and other live objects stay home.
CONFIG_KEYS = ("configurable", "metadata", "tags", "run_id", "run_name", "recursion_limit")

RESULT = b"r"
EVENT = b"e"
STARTED = b"s"
CANCEL = b"c"
"""First byte of an inbox entry: a task result, a custom stream event, a task a worker
started (sent for nodes with a timeout), or a cancel request."""


@dataclasses.dataclass(frozen=True, slots=True)
class StepState:
    """Everything a step's tasks share besides the graph: the claim check's content."""

    channel_values: Mapping[str, Any]
    config: Mapping[str, Any]
    stop: int
    resume: Mapping[str, list[Any]]
    resume_map: Mapping[str, Any] | None
    null_resume: Any
    namespace: tuple[str, ...]
    nesting: Nesting | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Nesting:
    """What a graph invoked inside a node needs from the run to nest under its task.

    A worker rebuilds the nesting context from it (``NestedInfo`` minus the saver, which
    stays with the coordinator), so such a graph streams under the task's namespace.
    """

    recursion_limit: int
    durability: str
    modes: tuple[str, ...]
    resuming: bool
    checkpoint_map: Mapping[str, str]


def dumps_state(state: StepState) -> bytes:
    """Encode a step state.

    Raises:
        SerializationError: a channel or config value has no msgpack form (naming it).
    """
    config = {k: v for k, v in state.config.items() if k in CONFIG_KEYS}
    record = [
        dict(state.channel_values),
        config,
        state.stop,
        dict(state.resume),
        state.resume_map,
        state.null_resume,
        list(state.namespace),
        None if state.nesting is None else dataclasses.astuple(state.nesting),
    ]
    parts = [("(step state)", key, value) for key, value in state.channel_values.items()]
    parts += [("(run config)", key, value) for key, value in config.items()]
    return _dumps_located(record, parts)


def _dumps_located(record: Any, parts: Sequence[tuple[str, str, Any]]) -> bytes:
    """Encode ``record``; on failure, raise the error of the first part that cannot be encoded.

    Raises:
        SerializationError: naming the node (or what holds the value), the key and the type.
    """
    try:
        return SERDE.dumps(record)
    except SerializationError as exc:
        for node, channel, value in parts:
            dumps_for(SERDE, value, node=node, channel=channel)
        raise exc


def loads_state(data: bytes) -> StepState:
    """Decode a step state written by ``dumps_state``."""
    values, config, stop, resume, resume_map, null_resume, namespace, nesting = SERDE.loads(data)
    return StepState(
        values,
        config,
        stop,
        resume,
        resume_map,
        null_resume,
        tuple(namespace),
        None if nesting is None else Nesting(*nesting),
    )


def dumps_input(value: Any, task: Task) -> bytes:
    """Encode a task's input (``MISSING`` — a node with nothing to read — included)."""
    if value is MISSING:
        return SERDE.dumps([False, None])
    return _dumps_located([True, value], [(task.name, "(task input)", value)])


def loads_input(data: bytes | None) -> Any:
    """Decode a task input; an absent one is ``MISSING``."""
    if data is None:
        return MISSING
    present, value = SERDE.loads(data)
    return value if present else MISSING


def _fits(value: Any) -> bool:
    try:
        SERDE.dumps(value)
    except SerializationError:
        return False
    return True


def slot(task_id: str, state: StepState) -> str:
    """Where a task's result is recorded: its id, and a digest of its resume answers if any.

    A task that paused on an interrupt has a result (the interrupt) under its id; resumed,
    it must run again, so a run with answers records under a slot of its own.
    """
    answers = state.resume.get(task_id)
    if not answers and state.resume_map is None and state.null_resume is None:
        return task_id
    digest = hashlib.blake2b(
        SERDE.dumps([answers or [], state.resume_map, state.null_resume]), digest_size=8
    )
    return f"{task_id}:{digest.hexdigest()}"


def describe_task(task: Task, result_slot: str) -> list[Any]:
    """A task as the Celery message carries it (its input travels apart)."""
    return [
        task.id,
        task.name,
        _plain(task.path),
        list(task.triggers),
        task.step,
        task.checkpoint_ns,
        result_slot,
    ]


def dumps_descs(descs: Sequence[list[Any]]) -> bytes:
    """Encode the descriptors of a batched message's tasks (kept in the step hash)."""
    return SERDE.dumps(list(descs))


def loads_descs(data: bytes) -> list[list[Any]]:
    """Decode descriptors written by ``dumps_descs``."""
    descs: list[list[Any]] = SERDE.loads(data)
    return descs


def read_task(desc: Sequence[Any], value: Any) -> Task:
    """The ``Task`` a message describes, with its input."""
    task_id, name, path, triggers, step, ns, _slot = desc
    return Task(task_id, name, _tupled(path), value, tuple(triggers), step, ns)


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def dumps_result(result: TaskResult, node: str) -> bytes:
    """Encode a task result; an unencodable write becomes the task's error, named."""
    writes = [[chan, value] for chan, value in result.writes]
    record = [result.task_id, writes, _error_record(result.error), list(result.interrupts)]
    parts = [(node, chan, value) for chan, value in result.writes]
    parts += [(node, "(interrupt value)", i.value) for i in result.interrupts]
    try:
        return _dumps_located(record, parts)
    except SerializationError as exc:
        return SERDE.dumps([result.task_id, [], _error_record(exc), []])


def loads_result(data: bytes) -> TaskResult:
    """Decode a task result written by ``dumps_result``."""
    task_id, writes, error, interrupts = SERDE.loads(data)
    return TaskResult(
        task_id,
        tuple((chan, value) for chan, value in writes),
        error=None if error is None else _rebuild_error(error),
        interrupts=tuple(i for i in interrupts if isinstance(i, Interrupt)),
    )


def _error_record(error: BaseException | None) -> list[Any] | None:
    if error is None:
        return None
    args = list(error.args) if _fits(list(error.args)) else [str(error)]
    trace = "".join(traceback.format_exception(error))
    return [type_ref(type(error)), describe_type(error), args, str(error), repr(error), trace]


def _rebuild_error(record: Sequence[Any]) -> BaseException:
    ref, type_name, args, message, original_repr, trace = record
    cls = lookup_loaded(ref)
    error: BaseException | None = None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            error = cls(*args)
        except Exception:  # a constructor that wants other arguments: keep the name only
            error = None
    if error is None:
        error = StoredError(type_name, message, original_repr)
    error.add_note(f"Raised remotely (a bulksync worker or coordinator):\n{trace}")
    return error


def dumps_event(namespace: Sequence[str], mode: str, chunk: Any) -> bytes:
    """Encode a stream event a task emits while it runs (``get_stream_writer``, or a graph
    invoked inside the node) for the step's inbox."""
    return SERDE.dumps([list(namespace), mode, chunk])


def loads_event(data: bytes) -> tuple[tuple[str, ...], str, Any]:
    """Decode a stream event written by ``dumps_event``."""
    namespace, mode, chunk = SERDE.loads(data)
    return tuple(namespace), mode, chunk


def dumps_error(error: BaseException) -> bytes:
    """Encode an error so that ``loads_error`` rebuilds its type where the class is loaded."""
    return SERDE.dumps(_error_record(error))


def loads_error(data: bytes) -> BaseException:
    """Decode an error written by ``dumps_error`` (a ``StoredError`` if its class is unknown)."""
    return _rebuild_error(SERDE.loads(data))
