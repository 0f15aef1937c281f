"""What a compiled graph is to the engine: channels, nodes, and how node output becomes writes.

The graph builder (``bulksync.graph``) produces a ``GraphSpec``; the pure core plans and
applies steps over it, and an executor runs its nodes. Nothing here depends on where a node
runs: a worker that loaded the same graph module rebuilds the same spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from bulksync.channels.base import BaseChannel
from bulksync.checkpoint.base import CheckpointSaver
from bulksync.types import CachePolicy, RetryPolicy, StateSnapshot, TimeoutPolicy

if TYPE_CHECKING:
    from bulksync.coordinator.executor import Executor

Write = tuple[str, Any]
"""``(channel, value)`` produced by a task."""


class ReadState(Protocol):
    """Reads the step's state as a node's branch sees it: with the node's own writes applied."""

    def __call__(self, select: Sequence[str] | str, writes: Sequence[Write]) -> Any:
        """Values of ``select`` after applying ``writes`` to a copy of the step's channels.

        A dict of the available channels among ``select`` (one value for a str).
        """


class NodeWriter(Protocol):
    """Turns a node's return value into channel writes (updates, edges, branches, gotos)."""

    def __call__(self, output: Any, read: ReadState) -> list[Write]:
        """The writes for ``output``, in order.

        Raises:
            InvalidUpdateError: for a key not in the state schema (naming node and key).
            InvalidGraphError: for a goto/Send/branch target that is not a node.
            ParentCommand: when the output is a ``Command(graph=Command.PARENT)``.
        """


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorHandler:
    """What runs when a node fails for good (its retries spent): ``run`` takes the failed
    task's input (and, if it declares it, the ``error``: a ``NodeError``); its output is
    written by ``writer`` in place of the node's, as an update or a ``Command``."""

    name: str
    run: Callable[[Any], Any]
    writer: NodeWriter
    retry_policy: tuple[RetryPolicy, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of a compiled graph.

    ``run`` is the user's function wrapped to take just the input (it reads config and
    stream writer from ``bulksync.context``); it may return an awaitable. A node that is a
    compiled graph has ``subgraph`` set instead and is run as a nested loop by the engine.
    """

    name: str
    triggers: tuple[str, ...]
    channels: tuple[str, ...] | str
    run: Callable[[Any], Any] | None
    writer: NodeWriter
    mapper: Callable[[Any], Any] | None = None
    subgraph: CompiledGraph | None = None
    retry_policy: tuple[RetryPolicy, ...] = ()
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tags: tuple[str, ...] = ()
    queue: str | None = None
    timeout: TimeoutPolicy | None = None
    is_async: bool = False
    managed: tuple[str, ...] = ()
    """Managed keys (``bulksync.managed``) the node's input holds besides its channels."""
    error_handler: ErrorHandler | None = None
    cache_policy: CachePolicy | None = None
    """Reuse the writes of an earlier task with the same input (``compile(cache=...)``)."""
    cache_ns: tuple[str, ...] = ()
    """The cache namespace of the node's results (``cached.py``)."""
    bookkeeping: bool = False
    """The node runs no user code (``START`` mapping the input to the state's channels): a
    cluster executor runs its tasks where the step is planned, not through a worker."""


@dataclasses.dataclass(frozen=True, slots=True)
class GraphSpec:
    """A compiled graph as the engine sees it.

    ``channels`` are templates (see ``channels/base.py``). ``input_channels`` receives the
    run input; ``output_channels`` is what ``invoke`` returns (a str: that one value);
    ``stream_channels`` is what the ``values`` stream shows.
    """

    name: str
    nodes: Mapping[str, NodeSpec]
    channels: Mapping[str, BaseChannel[Any, Any]]
    input_channels: str
    output_channels: tuple[str, ...] | str
    stream_channels: tuple[str, ...] | str
    trigger_to_nodes: Mapping[str, tuple[str, ...]]
    interrupt_before: tuple[str, ...] | str = ()
    interrupt_after: tuple[str, ...] | str = ()
    # The keys of the state schema, read by ``get_state`` to build ``values``.
    state_keys: tuple[str, ...] = ()
    managed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Managed state keys (``bulksync.managed``) and their kinds: read, never stored."""
    store: Any = None
    """The ``store.BaseStore`` given at compile time; a subgraph without one uses its
    parent's. A worker has its own copy (the graph module builds it): give a cluster graph a
    store every process reaches, such as ``PostgresStore``."""
    cache: Any = None
    """The node cache given at compile time (``bulksync.cache``); a subgraph without one uses
    its parent's. The coordinator consults it for node tasks."""


class CompiledGraph(Protocol):
    """What the engine needs of a compiled graph: its spec, its saver choice, its breakpoints.

    ``checkpointer`` is a saver, or for a subgraph ``True`` (keep its own history under a
    stable namespace), ``False`` (no checkpoints) or ``None`` (the parent's).
    """

    @property
    def spec(self) -> GraphSpec:
        """The graph as the engine sees it."""

    @property
    def checkpointer(self) -> CheckpointSaver | bool | None:
        """The saver given at compile time, or the subgraph flag."""

    @property
    def interrupt_before(self) -> Sequence[str] | str:
        """Nodes to pause before (``"*"``: every node)."""

    @property
    def interrupt_after(self) -> Sequence[str] | str:
        """Nodes to pause after (``"*"``: every node)."""

    @property
    def step_timeout(self) -> float | None:
        """Seconds each of its steps may take (None: no limit)."""


class RunnableGraph(CompiledGraph, Protocol):
    """A compiled graph as the services drive it: rebound to a saver or executor, then run."""

    def with_executor(self, executor: Executor) -> RunnableGraph:
        """The same graph, its tasks run by ``executor``."""

    def with_checkpointer(self, checkpointer: CheckpointSaver | None) -> RunnableGraph:
        """The same graph, checkpointing to ``checkpointer``."""

    def stream(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str | Sequence[str] | None = None,
        subgraphs: bool = False,
    ) -> Iterator[Any]:
        """Run and yield stream chunks as LangGraph frames them."""

    def get_state(self, config: Mapping[str, Any], *, subgraphs: bool = False) -> StateSnapshot:
        """The thread's state at ``config``."""

    def get_state_history(
        self,
        config: Mapping[str, Any],
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[StateSnapshot]:
        """The thread's checkpoints, newest first."""

    def update_state(
        self, config: Mapping[str, Any], values: Any, as_node: str | None = None
    ) -> dict[str, Any]:
        """Apply ``values`` as ``as_node``; the new checkpoint's config."""
