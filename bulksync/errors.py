"""The one error tree of bulksync.

::

    BulkSyncError
    ├── GraphRecursionError        (also RecursionError)
    ├── InvalidUpdateError         (also ValueError)
    ├── EmptyInputError            (also ValueError)
    ├── InvalidGraphError          (also ValueError)
    ├── SerializationError         (also TypeError)
    ├── UnknownInterruptError      (also RuntimeError)
    ├── EmptyChannelError
    ├── TaskCancelledError
    └── GraphBubbleUp              control flow, never shown to users as a failure
        ├── GraphInterrupt
        └── ParentCommand

Errors LangGraph also raises carry its names and stdlib bases, so ``except`` clauses written
for LangGraph keep working. Messages name the node, channel or key at fault and say what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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


class TaskCancelledError(BulkSyncError):
    """Raised in place of a task's result when its run was cancelled."""


class TaskTimeoutError(BulkSyncError, TimeoutError):
    """Raised in place of a task's result when it ran longer than its node's timeout."""


class UnknownGraphError(BulkSyncError, LookupError):
    """Raised when a graph id names no graph a worker or coordinator loaded at start."""


class LeaseLostError(BulkSyncError):
    """Raised when a coordinator writes to a thread whose lease another coordinator holds."""


class ThreadBusyError(BulkSyncError):
    """Raised when a run is submitted with ``multitask_strategy="reject"`` to a busy thread."""


class ServiceUnavailableError(BulkSyncError, ConnectionError):
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


class ParentCommand(GraphBubbleUp):
    """Raised when a node returns ``Command(graph=Command.PARENT)``; the parent applies it."""

    def __init__(self, command: Command[Any]) -> None:
        super().__init__(command)

    @property
    def command(self) -> Command[Any]:
        """The command to apply in the parent graph."""
        value: Command[Any] = self.args[0]
        return value


def node_error_message(node: str, detail: str, *, key: str | None = None) -> str:
    """Format an error about ``node`` (and ``key``) so every message reads alike."""
    where = f"node '{node}'" + (f", key '{key}'" if key is not None else "")
    return f"{where}: {detail}"


def describe_type(value: Any) -> str:
    """Name a value's type as ``module.Qualname`` for error messages."""
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"
