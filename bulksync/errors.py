"""The one error tree of bulksync.

::

    BulkSyncError                  (Exception)
    ├── GraphRecursionError        (also RecursionError)
    ├── InvalidUpdateError         (also ValueError)
    ├── EmptyInputError            (also ValueError)
    ├── InvalidGraphError          (also ValueError)
    ├── SerializationError         (also TypeError)
    ├── UnknownInterruptError      (also RuntimeError)
    ├── InvalidNamespaceError      (also ValueError)   a store namespace
    ├── NodeCancelledError                             a node raised asyncio.CancelledError
    ├── NodeTimeoutError                               an attempt outran its TimeoutPolicy
    ├── EmptyChannelError
    ├── CheckpointError                                stored rows that cannot make a checkpoint
    ├── ConfigError                (also ValueError)   a setting, argument or option
    │   └── UsageError                                 the command line, shown as one line
    ├── ServiceError               (also ConnectionError)
    │   └── ServiceUnavailableError
    ├── TaskError                  one task failed; crosses the wire with its ``retryable``
    │   ├── TaskCancelledError                         not retryable
    │   ├── TaskTimeoutError       (also TimeoutError) retryable
    │   ├── UnknownGraphError      (also LookupError)  not retryable
    │   ├── NodeFailedError                            a worker's Celery task, after a node error
    │   ├── WorkerLostError                            not retryable
    │   └── StoredError                                a task error of a class not loaded here
    ├── LeaseLostError
    ├── ThreadBusyError
    ├── ThreadExistsError                              a new thread's id is taken
    ├── ThreadGraphError           (also ValueError)   a thread run or read with another graph
    ├── ConflictError                                  not in the state it is in now (HTTP 409)
    ├── RequestTooLargeError                           an HTTP body over the API's limit
    ├── UnservedGraphError         (also LookupError)
    └── GraphBubbleUp              control flow, never shown to users as a failure
        ├── GraphInterrupt
        ├── GraphDrained                               a RunControl drain: resume later
        └── ParentCommand

Errors LangGraph also raises carry its names and stdlib bases, so ``except`` clauses written
for LangGraph keep working. Messages name the node, channel or key at fault and say what to do.
Where LangGraph raises a bare ``ValueError`` for the same call (``recursion_limit=0``, a
checkpointed run without ``thread_id``, ``add_messages`` misuse, …) bulksync does too: the
conformance suite compares error class names with LangGraph's.

``TaskError.retryable`` says whether running the task again may succeed: each class sets a
default, an instance may override it (``TaskError(msg, retryable=True)``), and
``bulksync.workers.wire`` carries the flag with the error, also onto a ``StoredError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from bulksync.types import Command, Interrupt


class BulkSyncError(Exception):
    """Raised for any failure bulksync detects itself; the root of the tree."""


class GraphRecursionError(BulkSyncError, RecursionError):
    """Raised when a run takes more supersteps than its ``recursion_limit`` allows."""


class InvalidUpdateError(BulkSyncError, ValueError):
    """Raised when a step's writes cannot be applied (two values for a plain key, …)."""


class EmptyInputError(BulkSyncError, ValueError):
    """Raised when a run starts with no input and no checkpoint to resume from."""


class InvalidGraphError(BulkSyncError, ValueError):
    """Raised when a graph definition is wrong (unknown node, no entry point, …)."""


class SerializationError(BulkSyncError, TypeError):
    """Raised when a value has a type the msgpack registry cannot encode or decode."""


class EmptyChannelError(BulkSyncError):
    """Raised when reading a channel that holds no value yet."""


class UnknownInterruptError(BulkSyncError, RuntimeError):
    """Raised when a resume names an interrupt id that is not pending."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeError:
    """Not an exception: what a node's ``error_handler`` gets as its ``error`` parameter
    (LangGraph's record): the node that failed, and its error."""

    node: str
    error: BaseException


class InvalidNamespaceError(BulkSyncError, ValueError):
    """Raised when a store namespace is empty, badly labelled, or rooted at ``langgraph``."""


class NodeCancelledError(BulkSyncError):
    """Raised when a node's own code raises ``asyncio.CancelledError``: a node failure.

    ``CancelledError`` is a ``BaseException``, so left as it is it would pass every
    ``except Exception`` on its way and the run would never hear of the task; like
    LangGraph, bulksync reports it as this error (not retried), naming the node.
    """

    def __init__(self, node: str) -> None:
        super().__init__(node)  # the one argument, so the error rebuilds across the wire
        self.node = node

    def __str__(self) -> str:
        return f"Node {self.node!r} raised asyncio.CancelledError"


class NodeTimeoutError(BulkSyncError):
    """Raised when an attempt of a node or ``@task`` call outran its ``TimeoutPolicy``.

    ``kind`` says which limit fired (``"run"``: the wall-clock cap; ``"idle"``: no progress
    for that long) and ``timeout`` its seconds; ``run_timeout`` and ``idle_timeout`` are the
    policy's. Not a ``TimeoutError``: like LangGraph's, the default retry policy retries it.
    """

    def __init__(
        self,
        node: str,
        elapsed: float,
        kind: Literal["idle", "run"],
        idle_timeout: float | None = None,
        run_timeout: float | None = None,
    ) -> None:
        limit = idle_timeout if kind == "idle" else run_timeout if kind == "run" else None
        if limit is None:
            raise ValueError(f"NodeTimeoutError(kind={kind!r}) needs that kind's timeout.")
        # Every field an argument, so the error rebuilds across the wire.
        super().__init__(node, elapsed, kind, idle_timeout, run_timeout)
        self.node = node
        self.elapsed = elapsed
        self.kind = kind
        self.timeout = limit
        self.idle_timeout = idle_timeout
        self.run_timeout = run_timeout

    def __str__(self) -> str:
        if self.kind == "idle":
            return (
                f"Node '{self.node}' made no progress for its idle timeout of "
                f"{self.timeout:.3f}s (elapsed: {self.elapsed:.3f}s); call runtime.heartbeat() "
                "while it works, or raise idle_timeout."
            )
        return (
            f"Node '{self.node}' ran past its run timeout of {self.timeout:.3f}s "
            f"(elapsed: {self.elapsed:.3f}s)."
        )


class TaskError(BulkSyncError):
    """Raised in place of a task's result when the task failed; says whether to retry it."""

    retryable: bool = False
    """Whether running the task again may succeed: the class's default, or this instance's."""

    def __init__(self, *args: object, retryable: bool | None = None) -> None:
        super().__init__(*args)
        if retryable is not None:
            self.retryable = retryable


class TaskCancelledError(TaskError):
    """Raised in place of a task's result when its run was cancelled."""

    retryable = False  # the run was stopped on purpose; running the task again undoes that


class TaskTimeoutError(TaskError, TimeoutError):
    """Raised in place of a task's result when it ran longer than its node's timeout."""

    retryable = True  # a busy worker or a slow service may well finish in time on a new try


class UnknownGraphError(TaskError, LookupError):
    """Raised when a graph id names no graph a worker or coordinator loaded at start."""

    # Processes load graphs only at start, so the same workers fail the task the same way
    # until they are restarted with --graph.
    retryable = False


class NodeFailedError(TaskError):
    """Raised by a worker's Celery task after it recorded a node's error for the coordinator.

    It makes Celery (and Flower) count the message as a FAILURE, naming the node, its run,
    thread and task ids and the node's own error; the run itself gets the node's error, not
    this one. The message is acknowledged like any other: it is not delivered again.
    """


class WorkerLostError(TaskError):
    """Raised when a task's worker died running it ``max_deliveries`` times; names it."""

    # A node that kills its process (os._exit, a segfault, the OOM killer) does so again.
    retryable = False

    def __init__(
        self, node: str, task_id: str, attempts: int, *, retryable: bool | None = None
    ) -> None:
        super().__init__(node, task_id, attempts, retryable=retryable)
        self.node = node
        self.task_id = task_id
        self.attempts = attempts

    def __str__(self) -> str:
        return node_error_message(
            self.node,
            f"task {self.task_id} lost its worker {self.attempts} times (the process running "
            "it died: os._exit, a crash or the OOM killer) and is not run again; find what "
            "kills the process in the node, or raise BULKSYNC_MAX_DELIVERIES.",
        )


class StoredError(TaskError):
    """Raised when a task failed with an error whose class this process has not loaded.

    Stored exception values decode to it too. It keeps the type's name, message and original
    repr; ``retryable`` is the original's when that was a ``TaskError``, else False (this
    process cannot judge a class it never loaded).
    """

    def __init__(
        self,
        type_name: str,
        message: str,
        original_repr: str | None = None,
        *,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.type_name = type_name
        self.message = message
        short = type_name.rsplit(".", 1)[-1]
        self.original_repr = original_repr or f"{short}({message!r})"

    def __repr__(self) -> str:
        return self.original_repr

    def __reduce__(self) -> tuple[type[StoredError], tuple[str, str, str], dict[str, Any]]:
        # For copy/deepcopy/pickle, whose default would call __init__ with the message alone;
        # the state dict keeps an overridden ``retryable`` (and any notes).
        return StoredError, (self.type_name, self.message, self.original_repr), dict(vars(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredError) and (
            (self.type_name, self.message, self.original_repr)
            == (other.type_name, other.message, other.original_repr)
        )

    def __hash__(self) -> int:
        return hash((self.type_name, self.message))


class LeaseLostError(BulkSyncError):
    """Raised when a coordinator writes to a thread whose lease another coordinator holds."""


class ThreadBusyError(BulkSyncError):
    """Raised when a run is submitted with ``multitask_strategy="reject"`` to a busy thread."""


class ThreadExistsError(BulkSyncError):
    """Raised when a thread is created with the id of a thread that exists."""


class ThreadGraphError(BulkSyncError, ValueError):
    """Raised when a run or read names a thread bound to another graph (its first writer's)."""


class ConflictError(BulkSyncError):
    """Raised when a thread or run cannot take a request in the state it is in now."""


class RequestTooLargeError(BulkSyncError):
    """Raised when an HTTP request's body is larger than the API's limit (api_max_body)."""


class UnservedGraphError(BulkSyncError, LookupError):
    """Raised when a run is submitted for a graph id that no live coordinator serves."""


class CheckpointError(BulkSyncError):
    """Raised when a saver's stored rows cannot make up a checkpoint (a row it needs is gone)."""


class ConfigError(BulkSyncError, ValueError):
    """Raised when a setting, argument or option has a value bulksync cannot use."""


class UsageError(ConfigError):
    """Raised when the command line or its environment cannot work; shown as one line."""


class ServiceError(BulkSyncError, ConnectionError):
    """Raised when a service bulksync depends on (broker, Redis, Postgres) fails it."""


class ServiceUnavailableError(ServiceError):
    """Raised when Redis, Postgres or the broker cannot be reached; names the URL to check."""


class GraphBubbleUp(BulkSyncError):
    """Raised to unwind a node for control flow (interrupts, parent commands)."""


class GraphInterrupt(GraphBubbleUp):
    """Raised when a node or a breakpoint pauses the run for outside input."""

    def __init__(self, interrupts: Sequence[Interrupt] = ()) -> None:
        super().__init__(tuple(interrupts))

    @property
    def interrupts(self) -> tuple[Interrupt, ...]:
        """The pending interrupts this pause carries (empty for breakpoints)."""
        value: tuple[Interrupt, ...] = self.args[0]
        return value


class GraphDrained(GraphBubbleUp):
    """Raised when a run stops at a step boundary because its ``RunControl`` asked it to."""

    def __init__(self, reason: str = "shutdown") -> None:
        super().__init__(f"Graph drained: {reason}")
        self.reason = reason


class ParentCommand(GraphBubbleUp):
    """Raised when a node returns ``Command(graph=Command.PARENT)``; the parent applies it."""

    def __init__(self, command: Command[Any]) -> None:
        super().__init__(command)

    @property
    def command(self) -> Command[Any]:
        """The command to apply in the parent graph."""
        value: Command[Any] = self.args[0]
        return value


REMOTE_NOTE = "Raised remotely (a bulksync worker or coordinator):"
"""How the note holding an error's remote traceback starts (``bulksync.workers.wire``)."""


def error_text(error: BaseException) -> str:
    """``Type: message``, then the error's notes that say where it was raised (not tracebacks).

    A run's error text: the note "During task with name 'n' and id 'i'" names the node.
    """
    notes = [n for n in getattr(error, "__notes__", ()) if not n.startswith(REMOTE_NOTE)]
    return "\n".join([f"{type(error).__name__}: {error}", *notes])


def node_error_message(node: str, detail: str, *, key: str | None = None) -> str:
    """Format an error about ``node`` (and ``key``) so every message reads alike."""
    where = f"node '{node}'" + (f", key '{key}'" if key is not None else "")
    return f"{where}: {detail}"


INVALID_RESUME = "_bulksync_invalid_resume"
"""The attribute that marks an error raised because a resume answer did not match its
interrupt's ``response_schema`` (it travels with the error across the wire)."""


def mark_invalid_resume(error: BaseException) -> BaseException:
    """Mark ``error`` as an invalid resume answer's (``is_invalid_resume``); return it."""
    setattr(error, INVALID_RESUME, True)
    return error


def is_invalid_resume(error: BaseException) -> bool:
    """Whether ``error`` was raised because a resume answer did not match the interrupt's
    ``response_schema`` (LangGraph's): the answer was not taken, the interrupt can be
    answered again."""
    return getattr(error, INVALID_RESUME, False) is True


def sync_timeout_error(what: str) -> InvalidGraphError:
    """The error for a timeout on ``what`` (``"Node 'x'"``, ``"Task 'y'"``) when it is sync."""
    return InvalidGraphError(
        f"{what} has a timeout, but timeouts are only supported for async nodes: a sync "
        "function cannot be stopped once it runs. Make it `async def`, or drop the timeout "
        "(on a cluster, the workers' task time limit, BULKSYNC_TASK_TIMEOUT, still stops any "
        "task)."
    )


def describe_type(value: Any) -> str:
    """Name a value's type as ``module.Qualname`` for error messages."""
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"
