"""What crosses between a coordinator and its workers, and how it is encoded.

Three records travel, all msgpack through the checkpoint serde (so the same explicit type
registry guards them, and nothing is unpickled):

- a **step input** (``StepInput``, the claim check): the step's channel values, the run's
  config, resume answers, namespace and nesting, put into Redis once per step;
- a **task descriptor** (``TaskDescriptor``): a task's id, node, path, triggers, step,
  namespace and result slot, carried in the Celery message as a compact list (a few hundred
  bytes); its input sits in the step hash;
- a **task result**: writes, interrupts, or an error, pushed to the step's inbox.

A value is encoded once: each write value and each channel value is msgpack bytes of its own
inside its record, read back as an ``Encoded`` (bytes plus a lazily decoded value). The
coordinator stores a worker's write bytes as the pending write and, for a ``LastValue``
channel, as its blob, and ships them on in the next step's input, never re-encoding them.

Errors keep their type when the class is loaded in the reading process (the worker and the
coordinator load the same graph modules); otherwise they arrive as ``StoredError`` naming
the type. Either way the traceback of where it was raised is attached as a note.
"""

from __future__ import annotations

import dataclasses
import hashlib
import traceback
from collections.abc import Sequence
from typing import Any

from bulksync import keys
from bulksync.channels.base import MISSING
from bulksync.checkpoint.base import Encoded, Serde
from bulksync.checkpoint.serde import (
    MsgpackSerde,
    dumps_for,
    lookup_loaded,
    pack_timeout,
    type_ref,
    unpack_timeout,
)
from bulksync.coordinator.executor import CallRecord, Nesting, StepInput, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.errors import (
    INVALID_RESUME,
    REMOTE_NOTE,
    SerializationError,
    StoredError,
    TaskError,
    describe_type,
    is_invalid_resume,
    mark_invalid_resume,
)
from bulksync.types import Interrupt, TimeoutPolicy

SERDE: Serde = MsgpackSerde()
"""The serde of every wire record (it resolves user types registered with ``register_type``)."""

# Config keys that mean something to a node; callbacks and other live objects stay home.
CONFIG_KEYS = ("configurable", "metadata", "tags", "run_id", "run_name", "recursion_limit")

RESULT = b"r"
EVENT = b"e"
STARTED = b"s"
CANCEL = b"c"
SAVE = b"w"
QUERY = b"q"
"""First byte of an inbox entry (after its address: ``addressed``): a task result, a custom
stream event, a task a worker started (sent for nodes with a timeout), a cancel request, or a
checkpoint write or read of a graph a task invoked (``celery/coordinator_saver.py``)."""

_ADDRESS_END = b"|"


def addressed(step_key: str, entry: bytes) -> bytes:
    """``entry`` as pushed to the inbox of its step's gatherer, which holds the entries of
    all its steps (``keys.inbox``): the step key first, then ``|`` (no step key holds one)."""
    return step_key.encode() + _ADDRESS_END + entry


def report(client: Any, step_key: str, *entries: bytes) -> None:
    """Push ``entries`` for ``step_key``'s step to its gatherer's inbox, addressed, in order
    (``client``: a Redis client, or a pipeline to queue the push on)."""
    client.rpush(keys.inbox(step_key), *(addressed(step_key, e) for e in entries))


def address_of(raw: bytes) -> tuple[str, bytes]:
    """The step key and the entry of an inbox entry (``addressed``)."""
    key, _, entry = raw.partition(_ADDRESS_END)
    return key.decode(), entry


@dataclasses.dataclass(frozen=True, slots=True)
class TaskDescriptor:
    """A task as its message names it: ids and position, never its input (in the step hash).

    It travels as a compact positional list (``pack``), a few hundred bytes at most.
    """

    id: str
    node: str
    path: tuple[Any, ...]
    triggers: tuple[str, ...]
    step: int
    checkpoint_ns: str
    slot: str
    """Where the task's result is recorded (see ``slot``)."""
    timeout: TimeoutPolicy | None = None
    """A ``Send``'s own timeout (packed only when there is one)."""

    @classmethod
    def of(cls, task: Task, result_slot: str) -> TaskDescriptor:
        """The descriptor of ``task``, recording under ``result_slot``."""
        return cls(
            task.id,
            task.name,
            task.path,
            tuple(task.triggers),
            task.step,
            task.checkpoint_ns,
            result_slot,
            task.timeout,
        )

    def pack(self) -> list[Any]:
        """The positional form messages carry (plain msgpack: tuples become lists)."""
        return [
            self.id,
            self.node,
            _plain(self.path),
            list(self.triggers),
            self.step,
            self.checkpoint_ns,
            self.slot,
            *pack_timeout(self.timeout),
        ]

    @classmethod
    def unpack(cls, data: Sequence[Any]) -> TaskDescriptor:
        """Read a descriptor written by ``pack`` (after any msgpack round trip)."""
        task_id, node, path, triggers, step, ns, slot, *rest = data
        timeout = unpack_timeout(rest)
        return cls(task_id, node, _tupled(path), tuple(triggers), step, ns, slot, timeout)

    def task(self, value: Any) -> Task:
        """The ``Task`` this descriptor names, with its input ``value``."""
        return Task(
            self.id,
            self.node,
            self.path,
            value,
            self.triggers,
            self.step,
            self.checkpoint_ns,
            self.timeout,
        )


def dumps_state(step: StepInput) -> bytes:
    """Encode a step's input (only the config keys a node can use travel).

    Raises:
        SerializationError: a channel or config value has no msgpack form (naming it).
    """
    config = {k: v for k, v in step.config.items() if k in CONFIG_KEYS}
    if "configurable" in config:  # a node's config handed on: its live objects stay here
        config["configurable"] = {
            k: v for k, v in config["configurable"].items() if not k.startswith("__pregel_")
        }
    # Each channel as bytes of its own: a value the loop already holds encoded (a worker's
    # write, a blob it stored) is not encoded again, and workers decode only what they read.
    values = {
        key: value_bytes(value, "(step state)", key) for key, value in step.channel_values.items()
    }
    from bulksync.workers.callback_relay import describe  # (it encodes with this module)

    record = [
        values,
        config,
        step.stop,
        dict(step.resume),
        step.resume_map,
        step.null_resume,
        list(step.namespace),
        None if step.nesting is None else _pack_nesting(step.nesting),
        step.context,
        dict(step.returns),
        dict(step.node_errors),
        describe(step.config.get("callbacks")),
        step.checkpointed,
    ]
    parts = [("(run config)", key, value) for key, value in config.items()]
    parts.append(("(run context)", "context", step.context))
    parts.extend(("(@task call)", task_id, value) for task_id, value in step.returns.items())
    parts.extend(("(node failure)", task_id, value) for task_id, value in step.node_errors.items())
    return _dumps_located(record, parts)


def value_bytes(value: Any, node: str, channel: str) -> bytes:
    """The wire bytes of one value: an ``Encoded``'s own when in the wire format.

    Raises:
        SerializationError: naming ``node`` and ``channel``.
    """
    if isinstance(value, Encoded):
        data = value.bytes_for(SERDE)
        if data is not None:
            return data
        value = value.value
    return dumps_for(SERDE, value, node=node, channel=channel)


def _pack_nesting(nesting: Nesting) -> list[Any]:
    return [
        nesting.recursion_limit,
        nesting.durability,
        list(nesting.modes),
        nesting.resuming,
        dict(nesting.checkpoint_map),
        nesting.subgraphs,
    ]


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


def loads_state(data: bytes) -> StepInput:
    """Decode a step input written by ``dumps_state``; channel values decode on first read."""
    # A step stored by an older coordinator lacks the fields after the nesting record.
    fields = SERDE.loads(data)
    values, config, stop, resume, resume_map, null_resume, namespace, nesting, *rest = fields
    return StepInput(
        {key: Encoded(value, SERDE) for key, value in values.items()},
        config,
        stop,
        resume,
        resume_map,
        null_resume,
        tuple(namespace),
        None if nesting is None else _unpack_nesting(nesting),
        rest[0] if rest else None,
        rest[1] if len(rest) > 1 else {},
        rest[2] if len(rest) > 2 else {},
        rest[3] if len(rest) > 3 else None,
        bool(rest[4]) if len(rest) > 4 else False,
    )


def _unpack_nesting(data: Sequence[Any]) -> Nesting:
    recursion_limit, durability, modes, resuming, checkpoint_map, *rest = data
    subgraphs = bool(rest[0]) if rest else False  # absent from an older coordinator's steps
    return Nesting(recursion_limit, durability, tuple(modes), resuming, checkpoint_map, subgraphs)


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


def slot(task_id: str, step: StepInput) -> str:
    """Where a task's result is recorded: its id, and a digest of its resume answers if any.

    A task that paused on an interrupt has a result (the interrupt) under its id; resumed,
    it must run again, so a run with answers records under a slot of its own.
    """
    answers = step.resume.get(task_id)
    if not answers and step.resume_map is None and step.null_resume is None:
        return task_id
    digest = hashlib.blake2b(
        SERDE.dumps([answers or [], step.resume_map, step.null_resume]), digest_size=8
    )
    return f"{task_id}:{digest.hexdigest()}"


def dumps_descs(descs: Sequence[TaskDescriptor]) -> bytes:
    """Encode the descriptors of a batched message's tasks (kept in the step hash)."""
    return SERDE.dumps([d.pack() for d in descs])


def loads_descs(data: bytes) -> list[TaskDescriptor]:
    """Decode descriptors written by ``dumps_descs``."""
    return [TaskDescriptor.unpack(d) for d in SERDE.loads(data)]


def dumps_descriptor(desc: TaskDescriptor) -> bytes:
    """Encode one descriptor on its own (what ``remote.run_encoded`` takes)."""
    return SERDE.dumps(desc.pack())


def loads_descriptor(data: bytes) -> TaskDescriptor:
    """Decode a descriptor written by ``dumps_descriptor``."""
    return TaskDescriptor.unpack(SERDE.loads(data))


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def dumps_result(result: TaskResult, node: str) -> bytes:
    """Encode a task result; an unencodable write becomes the task's error, named.

    Each write value is encoded on its own, so the coordinator can store those very bytes as
    the pending write (and the channel's blob) without decoding and encoding them again.
    """
    return encode_result(result, node)[0]


def encode_result(result: TaskResult, node: str) -> tuple[bytes, BaseException | None]:
    """``dumps_result``, and the error the encoded result carries: the task's own, or the
    ``SerializationError`` of a write or interrupt value msgpack cannot encode."""
    parts = [(node, "(interrupt value)", i.value) for i in result.interrupts]
    try:
        writes = [[chan, value_bytes(value, node, chan)] for chan, value in result.writes]
        calls = [
            [c.task_id, c.name, c.path, [[ch, value_bytes(v, c.name, ch)] for ch, v in c.writes]]
            for c in result.calls
        ]
        record = [
            result.task_id,
            writes,
            _error_record(result.error),
            list(result.interrupts),
            result.took_null_resume,
            result.interrupted,
            calls,
            result.handled_by,
        ]
        return _dumps_located(record, parts), result.error
    except SerializationError as exc:
        record = [result.task_id, [], _error_record(exc), [], result.took_null_resume, False]
        return SERDE.dumps(record), exc


def loads_result(data: bytes) -> TaskResult:
    """Decode a task result written by ``dumps_result``; write values stay ``Encoded`` (their
    bytes kept for storage, decoded on first use)."""
    # A result from an older worker has four fields (no flags): it paused iff it has
    # interrupts, and it took no run-wide resume answer as far as anyone knows.
    task_id, writes, error, interrupts, *flags = SERDE.loads(data)
    took_null_resume, interrupted = flags[:2] if flags else (False, bool(interrupts))
    calls = tuple(
        CallRecord(tid, name, path, tuple((ch, Encoded(v, SERDE)) for ch, v in call_writes))
        for tid, name, path, call_writes in (flags[2] if len(flags) > 2 else ())
    )
    return TaskResult(
        task_id,
        tuple((chan, Encoded(value, SERDE)) for chan, value in writes),
        error=None if error is None else _rebuild_error(error),
        interrupts=tuple(i for i in interrupts if isinstance(i, Interrupt)),
        interrupted=bool(interrupted),
        took_null_resume=bool(took_null_resume),
        calls=calls,
        handled_by=flags[3] if len(flags) > 3 else "",
    )


def _error_record(error: BaseException | None) -> list[Any] | None:
    if error is None:
        return None
    args = list(error.args) if _fits(list(error.args)) else [str(error)]
    trace = "".join(traceback.format_exception(error))
    # A StoredError stands in for a class never loaded here: pass that class's name on.
    type_name = error.type_name if isinstance(error, StoredError) else describe_type(error)
    retryable = error.retryable if isinstance(error, TaskError) else None
    ref = type_ref(type(error))
    # Notes other than a remote trace (which ``trace`` holds) go along: "During task …".
    notes = [n for n in getattr(error, "__notes__", ()) if not n.startswith(REMOTE_NOTE)]
    record = [ref, type_name, args, str(error), repr(error), trace, retryable, notes]
    details = _validation_details(error)
    if is_invalid_resume(error):  # the mark goes along (after the details slot)
        return [*record, details, [INVALID_RESUME]]
    return [*record, details] if details else record


def _validation_details(error: BaseException) -> list[Any] | None:
    """A pydantic ``ValidationError``'s title and errors, from which the other side rebuilds
    it (its constructor takes no arguments); None for other errors or unencodable details."""
    kind = type(error)
    if kind.__name__ != "ValidationError" or not kind.__module__.startswith("pydantic"):
        return None
    try:
        errors = [
            {"type": e["type"], "loc": list(e["loc"]), "input": e["input"]}
            | ({"ctx": e["ctx"]} if "ctx" in e else {})
            for e in error.errors(include_url=False)  # type: ignore[attr-defined]
        ]
    except (AttributeError, KeyError, TypeError):
        return None
    details = [getattr(error, "title", ""), errors]
    return details if _fits(details) else None


def _rebuild_error(record: Sequence[Any]) -> BaseException:
    # Records written before the retryable flag have six fields (runs keep them in Postgres).
    ref, type_name, args, message, original_repr, trace, *rest = record
    retryable = rest[0] if rest else None
    notes = rest[1] if len(rest) > 1 else []  # older records have no notes
    cls = lookup_loaded(ref)
    error: BaseException | None = None
    # A StoredError is rebuilt from the name it carries, not from its (message-only) args.
    if isinstance(cls, type) and issubclass(cls, BaseException) and cls is not StoredError:
        try:
            details = rest[2] if len(rest) > 2 else None
            rebuild = getattr(cls, "from_exception_data", None)  # pydantic's ValidationError
            error = rebuild(*details) if details and rebuild else cls(*args)
        except Exception:  # a constructor that wants other arguments: keep the name only
            error = None
    if error is None:
        error = StoredError(type_name, message, original_repr)
    if isinstance(error, TaskError) and isinstance(retryable, bool):
        error.retryable = retryable
    if len(rest) > 3 and INVALID_RESUME in rest[3]:
        mark_invalid_resume(error)
    for note in notes:
        if note not in getattr(error, "__notes__", ()):
            error.add_note(note)
    error.add_note(f"{REMOTE_NOTE}\n{trace}")
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
