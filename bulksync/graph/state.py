"""``StateGraph``: LangGraph's graph builder, compiled into the engine's ``GraphSpec``.

Nodes read and write one shared state whose keys are channels (``graph/schema.py``). Each node
``X`` runs when its trigger ``branch:to:X`` fires; edges, conditional edges and ``Command``
gotos fire it (``graph/writers.py``). ``build_spec`` does the compilation ``compile`` wraps;
``graph/validation.py`` checks the structure and ``graph/layout.py`` lays out ``get_graph()``.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from bulksync.channels.base import BaseChannel
from bulksync.channels.last_value import LastValue
from bulksync.checkpoint.serde import register_type
from bulksync.constants import END, NS_END, NS_SEP, RESERVED, START
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import InvalidGraphError
from bulksync.graph.branch import Branch
from bulksync.graph.runnable import is_runnable, runnable_call, runnable_name
from bulksync.graph.schema import (
    ROOT,
    command_destinations,
    declared_input_schema,
    declared_return,
    injecting_call,
    is_async_callable,
    may_return_command,
    schema_channels,
    schema_managed,
    stored_types,
)
from bulksync.graph.validation import check_reachable, check_structure
from bulksync.graph.writers import compile_nodes
from bulksync.settings import env_setting
from bulksync.stream.events import transformer_factories
from bulksync.types import CachePolicy, RetryPolicy, TimeoutPolicy
from bulksync.warnings import LangGraphDeprecatedSinceV05, LangGraphDeprecatedSinceV10

if TYPE_CHECKING:
    from bulksync.graph.compiled import CompiledStateGraph

logger = logging.getLogger(__name__)

StateT = TypeVar("StateT")
"""The state schema a ``StateGraph`` is annotated with (``StateGraph[MyState]``)."""


@dataclasses.dataclass(slots=True)
class StateNodeSpec:
    """A node as added to the builder: what it runs and how ``add_node`` configured it.

    ``ends`` are the declared destinations (for drawing and validation only);
    ``routes_anywhere`` marks nodes whose ``Command`` gotos cannot be known in advance:
    subgraphs, and nodes neither given destinations nor annotated to return no ``Command``.
    """

    action: Any
    input_schema: Any
    run: Callable[[Any], Any] | None
    subgraph: Any = None
    is_async: bool = False
    metadata: dict[str, Any] | None = None
    retry_policy: tuple[RetryPolicy, ...] = ()
    ends: tuple[str, ...] | dict[str, str] = ()
    defer: bool = False
    queue: str | None = None
    timeout: TimeoutPolicy | None = None
    routes_anywhere: bool = False
    error_handler: Any = None
    """Runs instead when the node fails for good (``add_node(error_handler=...)``)."""
    cache_policy: CachePolicy | None = None


class StateGraph(Generic[StateT]):
    """A graph whose nodes read a shared state and return updates to it (LangGraph's API)."""

    def __init__(
        self,
        state_schema: type[StateT],
        context_schema: Any = None,
        *,
        input_schema: Any = None,
        output_schema: Any = None,
        config_schema: Any = None,
        input: Any = None,
        output: Any = None,
    ) -> None:
        """Declare the state; input/output schemas default to it and add their own keys.

        ``context_schema`` types what ``invoke(..., context=...)`` gives nodes' ``Runtime``
        (``config_schema`` is LangGraph's deprecated name for it).
        """
        context_schema = _renamed("config_schema", config_schema, "context_schema", context_schema)
        input_schema = _renamed("input", input, "input_schema", input_schema)
        output_schema = _renamed("output", output, "output_schema", output_schema)
        self.nodes: dict[str, StateNodeSpec] = {}
        self.branches: dict[str, dict[str, Branch]] = {}
        self.schemas: dict[Any, dict[str, BaseChannel[Any, Any]]] = {}
        self.channels: dict[str, BaseChannel[Any, Any]] = {}
        # Managed keys (bulksync.managed) by schema, and of all schemas: no channel holds them.
        self.managed_of: dict[Any, dict[str, str]] = {}
        self.managed: dict[str, str] = {}
        self.compiled = False
        self.node_defaults: dict[str, Any] = {}
        """``set_node_defaults``: retry_policy, error_handler, timeout."""
        self.state_schema = state_schema
        self.context_schema = context_schema
        self.input_schema = input_schema or state_schema
        self.output_schema = output_schema or state_schema
        # Dicts used as ordered sets: the writes they produce come out in a stable order.
        self._edges: dict[tuple[str, str], None] = {}
        self._waiting_edges: dict[tuple[tuple[str, ...], str], None] = {}
        for schema in (self.state_schema, self.input_schema, self.output_schema):
            self._add_schema(schema)

    @property
    def edges(self) -> set[tuple[str, str]]:
        """The ``(start, end)`` pairs added with ``add_edge``."""
        return set(self._edges)

    @property
    def waiting_edges(self) -> set[tuple[tuple[str, ...], str]]:
        """The ``(starts, end)`` pairs added with ``add_edge([...], end)``."""
        return set(self._waiting_edges)

    @property
    def edges_in_order(self) -> list[tuple[str, str]]:
        """``edges`` in the order they were added (which orders a node's edge writes)."""
        return list(self._edges)

    @property
    def waiting_edges_in_order(self) -> list[tuple[tuple[str, ...], str]]:
        """``waiting_edges`` in the order they were added."""
        return list(self._waiting_edges)

    def _add_schema(self, schema: Any) -> None:
        if schema in self.schemas:
            return
        channels = schema_channels(schema)
        self.schemas[schema] = channels
        self.managed_of[schema] = schema_managed(schema)
        self.managed.update(self.managed_of[schema])
        for key, channel in channels.items():
            known = self.channels.get(key)
            if known is None:
                self.channels[key] = channel
            # A plain re-declaration keeps the earlier channel (a reducer wins), as in LangGraph.
            elif known != channel and not isinstance(channel, LastValue):
                raise InvalidGraphError(
                    f"Channel '{key}' already exists with a different type: "
                    f"{getattr(schema, '__name__', schema)!r} declares it differently from an "
                    "earlier schema; declare the key the same way (same reducer) in both."
                )

    def add_node(
        self,
        node: str | Any,
        action: Any = None,
        *,
        defer: bool = False,
        metadata: dict[str, Any] | None = None,
        input_schema: Any = None,
        retry_policy: RetryPolicy | Sequence[RetryPolicy] | None = None,
        destinations: dict[str, str] | tuple[str, ...] | None = None,
        queue: str | None = None,
        timeout: float | timedelta | TimeoutPolicy | None = None,
        retry: RetryPolicy | Sequence[RetryPolicy] | None = None,
        input: Any = None,
        error_handler: Any = None,
        cache_policy: CachePolicy | None = None,
    ) -> Self:
        """Add a node running ``action`` (a function, callable object or compiled graph).

        ``cache_policy`` (LangGraph's) reuses the writes of an earlier task of the node with
        the same input, given a cache at ``compile(cache=...)``.

        ``error_handler`` (LangGraph's) runs when the node fails after its retries: it gets
        the node's input (and ``error: NodeError`` if it declares it) and its update or
        ``Command`` is applied instead of the node's.

        Called with the action alone, the name is its ``__name__``, class name or graph name.
        ``queue`` (bulksync only) routes the node's tasks to a worker pool. ``timeout``
        (LangGraph's: a ``TimeoutPolicy``, or seconds of ``run_timeout``) fails an attempt of
        an async node that outruns it with ``NodeTimeoutError``, in-process and on a cluster
        alike; ``compile`` refuses it on a sync node, which cannot be stopped.

        Raises:
            InvalidGraphError: the name is taken or reserved, there is no action, or a
                timeout is not greater than 0.
        """
        retry_policy = _renamed("retry", retry, "retry_policy", retry_policy)
        input_schema = _renamed("input", input, "input_schema", input_schema)
        if not isinstance(node, str):
            node, action = _node_name(node), node
        if action is None:
            raise InvalidGraphError(f"add_node('{node}'): pass the function the node runs.")
        if is_runnable(action) and not isinstance(getattr(action, "spec", None), GraphSpec):
            # Called with the state and the node's config; a timed one through its async
            # side if it has one (only a coroutine can be stopped).
            action = runnable_call(action, prefer_async=timeout is not None)
        _check_node_name(node, self.nodes)
        policy = _timeout_policy(f"add_node('{node}')", timeout)
        if self.compiled:
            logger.warning("Adding a node to a compiled graph; recompile to include it.")
        subgraph = action if isinstance(getattr(action, "spec", None), GraphSpec) else None
        inferred = None if subgraph is not None or input_schema else declared_input_schema(action)
        returned = declared_return(action) if subgraph is None else None
        ends = destinations if destinations is not None else command_destinations(returned)
        if input_schema or inferred:
            self._add_schema(input_schema or inferred)
        self.nodes[node] = StateNodeSpec(
            action=action,
            input_schema=input_schema or inferred or self.state_schema,
            run=None if subgraph is not None else injecting_call(action),
            subgraph=subgraph,
            is_async=subgraph is None and is_async_callable(action),
            metadata=metadata,
            retry_policy=_retry_policies(retry_policy),
            ends=ends or (),
            defer=defer,
            queue=queue,
            timeout=policy,
            cache_policy=cache_policy,
            routes_anywhere=subgraph is not None or (not ends and may_return_command(returned)),
            error_handler=error_handler,
        )
        return self

    def set_node_defaults(
        self,
        *,
        retry_policy: RetryPolicy | Sequence[RetryPolicy] | None = None,
        error_handler: Any = None,
        timeout: float | timedelta | TimeoutPolicy | None = None,
        cache_policy: Any = None,
    ) -> Self:
        """Policies for every node that sets none of its own, applied at ``compile``
        (LangGraph's): ``retry_policy`` and ``timeout`` for every node, ``error_handler``
        for the nodes without one (a handler's own failure fails the run). Chainable.
        ``cache_policy`` for the nodes without one.
        """
        if cache_policy is not None:
            self.node_defaults["cache_policy"] = cache_policy
        if retry_policy is not None:
            self.node_defaults["retry_policy"] = _retry_policies(retry_policy)
        if error_handler is not None:
            self.node_defaults["error_handler"] = error_handler
        if timeout is not None:
            self.node_defaults["timeout"] = _timeout_policy("set_node_defaults()", timeout)
        return self

    def add_edge(self, start_key: str | Sequence[str], end_key: str) -> Self:
        """Run ``end_key`` after ``start_key``, or after all of a list of starts have run.

        Raises:
            InvalidGraphError: END as a start, START as an end, or (for a list) unknown nodes.
        """
        if self.compiled:
            logger.warning("Adding an edge to a compiled graph; recompile to include it.")
        starts = (start_key,) if isinstance(start_key, str) else tuple(start_key)
        if END in starts:
            raise InvalidGraphError("END cannot be a start node")
        if end_key == START:
            raise InvalidGraphError("START cannot be an end node")
        if isinstance(start_key, str):
            self._edges[(start_key, end_key)] = None
            return self
        if not starts:
            raise InvalidGraphError(f"add_edge([], '{end_key}'): list at least one start node.")
        for name in (*starts, end_key):
            if name not in self.nodes and name != END:
                raise InvalidGraphError(f"Need to add_node `{name}` first")
        self._waiting_edges[(starts, end_key)] = None
        return self

    def add_conditional_edges(
        self,
        source: str,
        path: Callable[..., Any],
        path_map: Mapping[Hashable, str] | Sequence[str] | None = None,
    ) -> Self:
        """After ``source``, run the node(s) ``path`` names (through ``path_map`` if given).

        Raises:
            InvalidGraphError: ``source`` already has a branch of the same name.
        """
        if self.compiled:
            logger.warning("Adding an edge to a compiled graph; recompile to include it.")
        branch = Branch.from_path(path, path_map)
        named = self.branches.setdefault(source, {})
        if branch.name in named:
            raise InvalidGraphError(
                f"Branch with name `{branch.name}` already exists for node `{source}`; "
                "give the path functions distinct names."
            )
        named[branch.name] = branch
        if branch.input_schema is not None:
            self._add_schema(branch.input_schema)
        return self

    def add_sequence(self, nodes: Sequence[Any | tuple[str, Any]]) -> Self:
        """Add nodes (actions or ``(name, action)`` pairs) joined by edges in the given order.

        Raises:
            InvalidGraphError: the sequence is empty or repeats a name.
        """
        if not nodes:
            raise InvalidGraphError("Sequence requires at least one node.")
        previous: str | None = None
        for item in nodes:
            name, action = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
            name = name if name is not None else _node_name(action)
            if name in self.nodes:
                raise InvalidGraphError(
                    f"Node names must be unique: node with the name '{name}' already exists. "
                    "Pass (name, action) tuples to name two nodes made from like callables."
                )
            self.add_node(name, action)
            if previous is not None:
                self.add_edge(previous, name)
            previous = name
        return self

    def set_entry_point(self, key: str) -> Self:
        """Run ``key`` first: ``add_edge(START, key)``."""
        return self.add_edge(START, key)

    def set_conditional_entry_point(
        self,
        path: Callable[..., Any],
        path_map: Mapping[Hashable, str] | Sequence[str] | None = None,
    ) -> Self:
        """Pick the first node(s) with ``path``: ``add_conditional_edges(START, ...)``."""
        return self.add_conditional_edges(START, path, path_map)

    def set_finish_point(self, key: str) -> Self:
        """End the run after ``key``: ``add_edge(key, END)``."""
        return self.add_edge(key, END)

    def validate(self, interrupt: Sequence[str] | None = None, *, strict: bool = False) -> Self:
        """Check the graph's structure; ``interrupt`` lists breakpoint nodes to check too.

        Raises:
            InvalidGraphError: an edge or branch names an unknown node, there is no entry
                point, a breakpoint names an unknown node, or (``strict``) a node cannot be
                reached.
        """
        check_structure(self, interrupt or ())
        if strict:
            check_reachable(self)
        self.compiled = True
        return self

    def compile(
        self,
        checkpointer: Any = None,
        *,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        debug: bool = False,
        name: str | None = None,
        strict: bool | None = None,
        store: Any = None,
        cache: Any = None,
        transformers: Sequence[Callable[[tuple[str, ...]], Any]] | None = None,
    ) -> CompiledStateGraph:
        """Validate and compile into a runnable graph (see ``build_spec``).

        ``store`` (a ``bulksync.store.BaseStore``) is what nodes get as ``runtime.store``,
        a ``store`` parameter or ``get_store()``; subgraphs without one share it. ``cache``
        (a ``bulksync.cache.BaseCache``) holds the results of nodes with a ``cache_policy``.

        ``strict`` (default: the ``BULKSYNC_STRICT`` setting, off) turns what LangGraph skips
        with a warning into errors: an update key outside the state schema, a goto, ``Send``
        or branch to an unknown node, a node that cannot be reached from START.

        ``transformers`` (``StreamTransformer`` classes or ``scope -> transformer``
        factories) add projections to every ``stream_events(version="v3")`` run.
        """
        from bulksync.graph.compiled import CompiledStateGraph

        check_checkpointer(checkpointer)
        stream_transformers = transformer_factories(transformers, "compile()")
        if "__default_error_handler__" in self.nodes and "error_handler" in self.node_defaults:
            raise ValueError(
                "Auto-generated default error handler node `__default_error_handler__` "
                "already exists: rename that node, or give its nodes their own error_handler."
            )
        graph_name = name or "LangGraph"
        strict = env_setting("strict") if strict is None else strict
        reached = [*self.schemas, self.context_schema]
        for cls in stored_types(reached):  # decodable by name, even if defined locally
            register_type(cls)
        spec = build_spec(self, interrupt_before, interrupt_after, name=graph_name, strict=strict)
        spec = dataclasses.replace(spec, store=store, cache=cache)
        return CompiledStateGraph(
            builder=self,
            spec=spec,
            checkpointer=checkpointer,
            debug=debug,
            name=graph_name,
            stream_transformers=stream_transformers,
        )


def check_checkpointer(checkpointer: Any) -> None:
    """Raise ``TypeError`` (LangGraph's words) unless ``checkpointer`` is a saver, a bool
    (a subgraph's choice) or None."""
    if checkpointer is None or isinstance(checkpointer, bool):
        return
    if not all(callable(getattr(checkpointer, m, None)) for m in ("get_tuple", "list", "put")):
        raise TypeError(
            "Invalid checkpointer provided. Expected an instance of a checkpoint saver "
            f"(InMemorySaver, SqliteSaver, PostgresSaver, …), True, False, or None. Received "
            f"{type(checkpointer).__name__}."
        )


def _renamed(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of an argument LangGraph renamed: ``new_value``, else ``old_value`` (with
    LangGraph's deprecation warning, the warning class of the release that renamed it)."""
    if old_value is None:
        return new_value
    since = LangGraphDeprecatedSinceV10 if old == "config_schema" else LangGraphDeprecatedSinceV05
    message = f"`{old}` is deprecated and will be removed. Please use `{new}` instead."
    warnings.warn(since(message), stacklevel=3)
    return new_value if new_value is not None else old_value


def _node_name(action: Any) -> str:
    if isinstance(getattr(action, "spec", None), GraphSpec):
        name = getattr(action, "name", None)
    elif is_runnable(action):
        name = runnable_name(action)
    else:
        name = getattr(action, "__name__", type(action).__name__)
    if not isinstance(name, str):
        raise InvalidGraphError("Node name must be provided if action is not a function")
    return name


def _check_node_name(name: str, nodes: Mapping[str, Any]) -> None:
    if name in nodes:
        raise InvalidGraphError(f"Node `{name}` already present.")
    if name in RESERVED:
        raise InvalidGraphError(f"Node `{name}` is reserved.")
    for character in (NS_SEP, NS_END):
        if character in name:
            raise InvalidGraphError(
                f"'{character}' is a reserved character and is not allowed in the node names."
            )


def _timeout_policy(where: str, timeout: Any) -> TimeoutPolicy | None:
    """``timeout`` as a policy, or an error naming ``where`` it was given."""
    try:
        return TimeoutPolicy.coerce(timeout)
    except ValueError as exc:
        raise InvalidGraphError(f"{where}: {exc}") from None


def _retry_policies(policy: RetryPolicy | Sequence[RetryPolicy] | None) -> tuple[RetryPolicy, ...]:
    if policy is None:
        return ()
    if isinstance(policy, RetryPolicy):  # a NamedTuple: test before treating it as a sequence
        return (policy,)
    return tuple(policy)


def _interrupts(nodes: Sequence[str] | str | None) -> tuple[str, ...] | str:
    if nodes is None:
        return ()
    return nodes if isinstance(nodes, str) else tuple(nodes)


def build_spec(
    builder: StateGraph[Any],
    interrupt_before: Sequence[str] | str | None = None,
    interrupt_after: Sequence[str] | str | None = None,
    *,
    name: str = "LangGraph",
    strict: bool = False,
) -> GraphSpec:
    """Validate ``builder`` and compile it into the ``GraphSpec`` the engine runs.

    Raises:
        InvalidGraphError: as ``StateGraph.validate``.
    """
    before, after = _interrupts(interrupt_before), _interrupts(interrupt_after)
    breakpoints = [n for group in (before, after) if group != "*" for n in group]
    builder.validate(breakpoints, strict=strict)
    channels, nodes = compile_nodes(builder, strict=strict)
    trigger_to_nodes: dict[str, list[str]] = {}
    for key, node in nodes.items():
        for trigger in node.triggers:
            trigger_to_nodes.setdefault(trigger, []).append(key)
    output_keys = tuple(builder.schemas[builder.output_schema])
    # Every key of every schema, as LangGraph's values stream and get_state show them.
    all_keys = tuple(builder.channels)
    return GraphSpec(
        name=name,
        nodes=nodes,
        channels=channels,
        input_channels=START,
        output_channels=ROOT if output_keys == (ROOT,) else output_keys,
        stream_channels=ROOT if all_keys == (ROOT,) else all_keys,
        trigger_to_nodes={k: tuple(v) for k, v in trigger_to_nodes.items()},
        managed=dict(builder.managed),
        interrupt_before=before,
        interrupt_after=after,
        state_keys=all_keys,
    )
