"""What a running node can know about its run: ``Runtime``, as ``langgraph.runtime`` has it.

A node gets it by declaring a ``runtime`` parameter (``def node(state, runtime:
Runtime[Ctx])``) or by calling ``get_runtime()``: the run's ``context`` (what
``invoke(..., context=...)`` was given, as an instance of the graph's ``context_schema``), the
``store``, the task's ``stream_writer`` and ``heartbeat``, ``execution_info`` (thread, run,
checkpoint, task and attempt) and ``server_info`` (the assistant, graph and user a server
started the run for). On a cluster the context travels to the workers with the step, in
bulksync's msgpack serde.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from bulksync.context import current_task

ContextT = TypeVar("ContextT")


def _no_stream(chunk: Any) -> None:
    """The stream writer of a runtime made outside a run: writes nowhere."""


def _no_heartbeat() -> None:
    """The heartbeat of a runtime made outside a run: does nothing."""


class RunControl:
    """Lets a run be stopped cleanly: ``request_drain()`` (from a node, a signal handler,
    another thread) makes the run stop before its next step, its checkpoint saved, with
    ``GraphDrained``; the thread resumes from there. One per run: it stays drained."""

    __slots__ = ("_reason",)

    def __init__(self) -> None:
        self._reason: str | None = None

    def request_drain(self, reason: str = "shutdown") -> None:
        """Ask the run to stop at its next step boundary (one attribute write: thread-safe)."""
        self._reason = reason

    @property
    def drain_requested(self) -> bool:
        """Whether a drain was asked for."""
        return self._reason is not None

    @property
    def drain_reason(self) -> str | None:
        """Why, as given to ``request_drain``."""
        return self._reason


@dataclasses.dataclass(frozen=True, slots=True)
class ExecutionInfo:
    """Where a task runs: its checkpoint, namespace, task, thread and run, and its attempt."""

    checkpoint_id: str
    checkpoint_ns: str
    task_id: str
    thread_id: str | None = None
    run_id: str | None = None
    node_attempt: int = 1
    node_first_attempt_time: float | None = None

    def patch(self, **changes: Any) -> ExecutionInfo:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, slots=True)
class ServerInfo:
    """Who a run was started for, when a server started it (LangGraph's): the assistant and
    graph ids and the authenticated user, read from the run's ``configurable``
    (``assistant_id``, ``graph_id``, ``langgraph_auth_user``)."""

    assistant_id: str
    graph_id: str
    user: Any = None

    @classmethod
    def of(cls, configurable: Mapping[str, Any]) -> ServerInfo | None:
        """The server info a run's ``configurable`` holds; None when it holds none."""
        assistant_id, graph_id = configurable.get("assistant_id"), configurable.get("graph_id")
        user = configurable.get("langgraph_auth_user")
        if user is not None and not hasattr(user, "identity"):  # not a user (BaseUser)
            user = None
        if assistant_id is None and graph_id is None and user is None:
            return None
        return cls(str(assistant_id or ""), str(graph_id or ""), user)


@dataclasses.dataclass(frozen=True, slots=True)
class Runtime(Generic[ContextT]):
    """The run as a node sees it: context, store, stream writer, execution info."""

    context: ContextT = dataclasses.field(default=None)  # type: ignore[assignment]
    store: Any = None
    stream_writer: Callable[[Any], None] = _no_stream
    heartbeat: Callable[[], None] = _no_heartbeat
    previous: Any = None
    execution_info: ExecutionInfo | None = None
    server_info: Any = None
    control: Any = None

    def merge(self, other: Runtime[ContextT]) -> Runtime[ContextT]:
        """This runtime with every field ``other`` sets (not None, not a default) taken
        from ``other``."""
        changes = {
            f.name: getattr(other, f.name)
            for f in dataclasses.fields(self)
            if getattr(other, f.name) not in (None, f.default)
        }
        return dataclasses.replace(self, **changes)

    def override(self, **changes: Any) -> Runtime[ContextT]:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


def get_runtime(context_schema: type[ContextT] | None = None) -> Runtime[ContextT]:
    """The running node's ``Runtime`` (``context_schema`` only types the result).

    Raises:
        RuntimeError: when called outside a node bulksync is running.
    """
    runtime: Runtime[ContextT] | None = current_task().runtime
    return runtime if runtime is not None else Runtime()


__all__ = ["ExecutionInfo", "Runtime", "ServerInfo", "get_runtime"]
