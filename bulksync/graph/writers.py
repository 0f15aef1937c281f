"""How a node's return value becomes channel writes: updates, gotos, edges, then branches.

The order is LangGraph's (``CompiledStateGraph.attach_node/attach_edge/attach_branch``):

1. state updates from the output (a dict, a ``Command``'s update, a dataclass or pydantic
   instance, or a list mixing ``Command``s and those), then the output's gotos and ``Send``s;
2. the node's static edges: ``branch:to:<b>`` for ``add_edge(node, b)`` and the node's name
   into ``join:…`` for each waiting edge it starts;
3. each conditional edge, evaluated on the state with the writes so far applied.

Unlike LangGraph, which drops them silently, bulksync raises on an update to a key the state
does not have and on routing to a node the graph does not have (DESIGN.md §1.8). The hidden
``__start__`` node and subgraph nodes keep LangGraph's leniency: input keys outside the input
schema and a subgraph's private keys are dropped, as LangGraph documents.

``compile_nodes`` wires it up: the trigger channels the edges write (``branch:to:*``,
``join:*``) and one ``NodeSpec`` with its writer per node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.channels.ephemeral_value import EphemeralValue
from bulksync.channels.last_value import LastValueAfterFinish
from bulksync.channels.named_barrier_value import NamedBarrierValue, NamedBarrierValueAfterFinish
from bulksync.channels.topic import Topic
from bulksync.constants import END, START, TASKS
from bulksync.coordinator.cached import cache_namespace
from bulksync.coordinator.spec import ErrorHandler, NodeSpec, NodeWriter, ReadState, Write
from bulksync.errors import (
    InvalidGraphError,
    InvalidUpdateError,
    ParentCommand,
    node_error_message,
    sync_timeout_error,
)
from bulksync.graph.branch import Branch, check_destination, warn_once
from bulksync.graph.runnable import is_runnable, runnable_call
from bulksync.graph.schema import ROOT, injecting_call, is_pydantic_model, schema_mapper
from bulksync.types import Command, RetryPolicy, Send, TimeoutPolicy

if TYPE_CHECKING:
    from bulksync.graph.state import StateGraph

HIDDEN_TAG = "langsmith:hidden"
"""Tag of the ``__start__`` task: streams leave it out, as LangGraph does."""

BRANCH_TO = "branch:to:{}"
"""The channel that triggers a node, formatted with the node's name."""


def branch_channel(node: str) -> str:
    """The trigger channel of ``node``."""
    return BRANCH_TO.format(node)


def join_channel(starts: Sequence[str], end: str) -> str:
    """The barrier channel of ``add_edge([a, b], end)``: ``join:a+b:end``."""
    return f"join:{'+'.join(starts)}:{end}"


@dataclasses.dataclass(frozen=True, slots=True)
class StateKeys:
    """The keys a node may update, in channel order; ``strict`` raises on any other key."""

    order: tuple[str, ...]
    strict: bool = True
    silent: bool = False
    """Drop other keys without a word: a subgraph's private keys, input keys outside the
    input schema (both normal, as in LangGraph)."""
    members: frozenset[str] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", frozenset(self.order))

    @property
    def is_root(self) -> bool:
        """Whether the state is one value kept under ``__root__``."""
        return self.order == (ROOT,)


@dataclasses.dataclass(frozen=True, slots=True)
class BranchReader:
    """A branch plus how it reads the state: the keys, and the schema coercion to apply."""

    branch: Branch
    select: tuple[str, ...] | str
    mapper: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class StateNodeWriter:
    """The ``NodeWriter`` of one node of a ``StateGraph`` (see ``coordinator/spec.py``)."""

    node: str
    keys: StateKeys
    nodes: frozenset[str]
    edges: tuple[Write, ...] = ()
    branches: tuple[BranchReader, ...] = ()
    strict: bool = False
    """Raise (instead of skipping with a warning) on a goto, Send or branch to an unknown
    node; the keys carry their own ``strict`` for updates."""

    def __call__(self, output: Any, read: ReadState) -> list[Write]:
        """The writes for ``output``, in LangGraph's order.

        Raises:
            ParentCommand: the output holds a ``Command(graph=Command.PARENT)``.
            InvalidUpdateError: the output is not an update, or (strict) updates an unknown
                key.
            InvalidGraphError: (strict) a goto, ``Send`` or branch names a node the graph
                lacks.
        """
        commands = _commands(output)
        for command in commands:
            if command.graph == Command.PARENT:
                raise ParentCommand(command)
        writes = output_updates(self.node, output, self.keys)
        writes.extend(control_writes(self.node, output, commands, self.nodes, self.strict))
        writes.extend(self.edges)
        for reader in self.branches:
            writes.extend(self._branch_writes(reader, output, read, writes))
        return writes

    def _branch_writes(
        self, reader: BranchReader, output: Any, read: ReadState, so_far: Sequence[Write]
    ) -> list[Write]:
        value = read(reader.select, list(so_far))
        if reader.mapper is not None:
            value = reader.mapper(value)
        elif reader.branch.input_schema is None and isinstance(value, dict):
            # LangGraph hands the path the node's own output keys too, under the state's.
            value = {**output, **value} if isinstance(output, dict) else value
        picked = reader.branch.route(self.node, value, self.nodes, strict=self.strict)
        return [(TASKS, d) if isinstance(d, Send) else (branch_channel(d), None) for d in picked]


def _commands(output: Any) -> list[Command[Any]]:
    if isinstance(output, Command):
        return [output]
    if isinstance(output, (list, tuple)):
        return [item for item in output if isinstance(item, Command)]
    return []


def output_updates(node: str, output: Any, keys: StateKeys) -> list[Write]:
    """Step 1: the state updates in ``output``, checked against ``keys``.

    Raises:
        InvalidUpdateError: ``output`` is not an update, or (strict) names an unknown key.
    """
    if keys.is_root:
        return _root_updates(output)
    if output is None or isinstance(output, Send):
        return []
    if isinstance(output, dict):
        return _checked(node, list(output.items()), keys)
    if isinstance(output, Command):
        return _checked(node, output.update_items(), keys)
    if isinstance(output, (list, tuple)) and any(isinstance(i, Command) for i in output):
        writes: list[Write] = []
        for item in output:
            if isinstance(item, Send):
                raise _not_an_update(node, output, "a Send inside a list")
            writes.extend(output_updates(node, item, keys))
        return writes
    fields = object_fields(output)
    if fields is None:
        raise _not_an_update(node, output, None)
    return _checked(node, object_updates(output, fields, keys), keys)


def _not_an_update(node: str, output: Any, what: str | None) -> InvalidUpdateError:
    detail = f"Expected dict, got {output!r}" + (f" ({what})" if what else "") + "."
    return InvalidUpdateError(
        node_error_message(
            node,
            f"{detail} A node must return a dict of state updates, a Command, a dataclass or "
            "pydantic state instance, a list of Commands and updates, or None. To fan out, "
            "return Command(goto=[Send(...), ...]).",
        )
    )


def _checked(node: str, pairs: list[Write], keys: StateKeys) -> list[Write]:
    """``pairs`` whose key is a state key. Another key is dropped, as LangGraph drops it —
    with a warning when the node could have meant it (not a subgraph's private key, not an
    input outside the input schema) — or raises when ``keys.strict``."""
    kept: list[Write] = []
    for key, value in pairs:
        if key in keys.members:
            kept.append((key, value))
            continue
        if keys.silent:
            continue
        message = node_error_message(
            node,
            f"update names '{key}', which is not a key of the graph state. Valid keys: "
            f"{sorted(keys.members)}. Add '{key}' to the state schema, or stop returning it.",
            key=key,
        )
        if keys.strict:
            raise InvalidUpdateError(message)
        warn_once(f"{message} Ignored (compile with strict=True to raise).")
    return kept


def _root_updates(output: Any) -> list[Write]:
    """Updates of a keyless state: the whole output is the new ``__root__`` value."""
    if isinstance(output, Command):
        return [] if output.graph == Command.PARENT else output.update_items()
    if isinstance(output, (list, tuple)) and any(isinstance(i, Command) for i in output):
        writes: list[Write] = []
        for item in output:
            writes.extend(_root_updates(item) if isinstance(item, Command) else [(ROOT, item)])
        return writes
    return [] if output is None else [(ROOT, output)]


def object_fields(value: Any) -> tuple[str, ...] | None:
    """The fields of a dataclass, pydantic or other annotated instance; None for the rest."""
    cls = type(value)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    if is_pydantic_model(cls):
        return tuple(cls.model_fields)
    # LangGraph reads any instance of a class with annotations (a NamedTuple, a plain class).
    names: dict[str, None] = {}
    for base in reversed(cls.__mro__):
        annotations = vars(base).get("__annotations__")
        if isinstance(annotations, dict):
            names.update(dict.fromkeys(annotations))
    return tuple(names) or None


def object_updates(value: Any, fields: Collection[str], keys: StateKeys) -> list[Write]:
    """The updates an instance returned by a node stands for, in channel order.

    Like LangGraph, a pydantic field left at a ``None`` default and never set is no update;
    fields that are not state keys come last so that a strict check can name them.
    """
    defaults: dict[str, Any] = {}
    explicitly_set: Collection[str] = ()
    if is_pydantic_model(type(value)):
        defaults = {k: f.default for k, f in type(value).model_fields.items()}
        explicitly_set = value.model_fields_set
    ordered = [k for k in keys.order if k in fields] + [k for k in fields if k not in keys.members]
    pairs: list[Write] = []
    for key in ordered:
        item = getattr(value, key, MISSING)
        if item is MISSING:
            continue
        if item is None and defaults.get(key, MISSING) is None and key not in explicitly_set:
            continue
        pairs.append((key, item))
    return pairs


def control_writes(
    node: str,
    output: Any,
    commands: Sequence[Command[Any]],
    nodes: Collection[str],
    strict: bool,
) -> list[Write]:
    """Step 1, second half: a returned ``Send`` and each ``Command``'s ``goto`` (a node the
    graph lacks skipped with a warning, unless ``strict``).

    Raises:
        InvalidGraphError: (``strict``) a goto or ``Send`` names a node the graph lacks.
        InvalidUpdateError: a ``Send`` is addressed to END.
    """
    if isinstance(output, Send):
        known = check_destination(node, output, nodes, via="returned Send", strict=strict)
        return [(TASKS, output)] if known else []
    writes: list[Write] = []
    for command in commands:
        goto = command.goto
        targets = [goto] if isinstance(goto, (Send, str)) else list(goto)
        for target in targets:
            if not check_destination(node, target, nodes, via="Command(goto=...)", strict=strict):
                continue
            if isinstance(target, Send):
                writes.append((TASKS, target))
            elif target != END:
                writes.append((branch_channel(target), None))
    return writes


def compile_nodes(
    builder: StateGraph[Any], *, strict: bool = False
) -> tuple[dict[str, BaseChannel[Any, Any]], dict[str, NodeSpec]]:
    """Every channel of the compiled graph, and every node (``__start__`` first) with its writer.

    Channel order is LangGraph's: state keys, ``__start__``, ``__pregel_tasks``, the
    ``branch:to:*`` triggers, then ``join:*`` barriers.
    """
    channels, triggers, edge_writes = trigger_layout(builder)
    names = frozenset(builder.nodes)
    start_branches = _branch_readers(builder, START)
    start_writer = StateNodeWriter(
        START,
        StateKeys(tuple(builder.schemas[builder.input_schema]), strict=False, silent=True),
        names,
        tuple(edge_writes[START]),
        start_branches,
        strict,
    )
    nodes = {
        START: NodeSpec(
            name=START,
            triggers=(START,),
            channels=START,
            run=_passthrough,
            writer=start_writer,
            tags=(HIDDEN_TAG,),
            # A conditional edge from START is the user's function: it runs on a worker.
            bookkeeping=not start_branches,
        )
    }
    all_keys = tuple(builder.channels)
    defaults = builder.node_defaults
    for key, node in builder.nodes.items():
        read = tuple(builder.schemas[node.input_schema])
        retry_policy = node.retry_policy or defaults.get("retry_policy", ())
        # A subgraph returns its whole state: keys the parent lacks are dropped, as in LangGraph.
        private = node.subgraph is not None
        keys = StateKeys(all_keys, strict=strict and not private, silent=private)
        writer = StateNodeWriter(
            key, keys, names, tuple(edge_writes[key]), _branch_readers(builder, key), strict
        )
        nodes[key] = NodeSpec(
            name=key,
            triggers=tuple(triggers[key]),
            channels=ROOT if read == (ROOT,) else read,
            run=node.run,
            writer=writer,
            mapper=None if read == (ROOT,) else schema_mapper(node.input_schema),
            subgraph=node.subgraph,
            retry_policy=retry_policy,
            metadata=dict(node.metadata or {}),
            queue=node.queue,
            timeout=_timeout(key, node, defaults.get("timeout")),
            cache_policy=node.cache_policy or defaults.get("cache_policy"),
            cache_ns=cache_namespace(key, node.action),
            is_async=node.is_async,
            managed=tuple(builder.managed_of[node.input_schema]),
            error_handler=_error_handler(
                key,
                node.error_handler,
                defaults.get("error_handler"),
                StateNodeWriter(key, keys, names, (), (), strict),
                retry_policy,
            ),
        )
    return channels, nodes


def _timeout(key: str, node: Any, default: TimeoutPolicy | None) -> TimeoutPolicy | None:
    """The node's timeout (its own, else the builder's default).

    Raises:
        InvalidGraphError: the node has one but is sync or a subgraph: only a coroutine can
            be stopped (as in LangGraph), and bulksync times no subgraph node yet.
    """
    policy = node.timeout if node.timeout is not None else default
    if policy is None or node.is_async:
        return policy
    if node.subgraph is not None:
        raise InvalidGraphError(
            f"Node '{key}' is a subgraph with a timeout: bulksync does not time a subgraph "
            "node yet. Set the timeout on the subgraph's own async nodes instead."
        )
    raise sync_timeout_error(f"Node '{key}'")


def error_handler_name(node: str, *, own: bool) -> str:
    """LangGraph's name for the handler of ``node``: its own, or the graph's default one
    (``interrupt_before`` may name it; its update streams under it)."""
    return f"__error_handler__{node}" if own else "__default_error_handler__"


def _error_handler(
    node: str,
    own: Any,
    default: Any,
    writer: NodeWriter,
    retry_policy: tuple[RetryPolicy, ...],
) -> ErrorHandler | None:
    """The handler run when ``node`` fails for good: its output is written as an update or
    ``Command`` of the node, without the node's own edges (LangGraph's handler is a node of
    its own, with none); it retries as the node does. Its update streams under LangGraph's
    name for it."""
    handler = own if own is not None else default
    if handler is None:
        return None
    name = error_handler_name(node, own=own is not None)
    if is_runnable(handler):
        handler = runnable_call(handler)
    return ErrorHandler(name, injecting_call(handler), writer, retry_policy)


def _passthrough(value: Any) -> Any:
    """The hidden ``__start__`` node: its output is the run input."""
    return value


def trigger_layout(
    builder: StateGraph[Any],
) -> tuple[dict[str, BaseChannel[Any, Any]], dict[str, list[str]], dict[str, list[Write]]]:
    """All channels, each node's trigger channels, and each node's static edge writes."""
    channels: dict[str, BaseChannel[Any, Any]] = dict(builder.channels)
    channels[START] = EphemeralValue(builder.input_schema, key=START)
    channels[TASKS] = Topic(Send, accumulate=False, key=TASKS)
    triggers: dict[str, list[str]] = {}
    for key, node in builder.nodes.items():
        channel = branch_channel(key)
        channels[channel] = (
            LastValueAfterFinish(Any, key=channel)
            if node.defer
            else EphemeralValue(Any, guard=False, key=channel)
        )
        triggers[key] = [channel]
    edge_writes: dict[str, list[Write]] = {key: [] for key in (START, *builder.nodes)}
    for start, end in builder.edges_in_order:
        if end != END:
            edge_writes[start].append((branch_channel(end), None))
    for starts, end in builder.waiting_edges_in_order:
        if end == END:
            continue
        channel = join_channel(starts, end)
        barrier = NamedBarrierValueAfterFinish if builder.nodes[end].defer else NamedBarrierValue
        channels[channel] = barrier(str, set(starts), key=channel)
        triggers[end].append(channel)
        for start in starts:
            edge_writes[start].append((channel, start))
    return channels, triggers, edge_writes


def _branch_readers(builder: StateGraph[Any], source: str) -> tuple[BranchReader, ...]:
    """``source``'s branches, each reading its path's schema, else the node's, else the state."""
    readers = []
    for branch in builder.branches.get(source, {}).values():
        node = builder.nodes.get(source)
        schema = branch.input_schema or (node.input_schema if node else builder.state_schema)
        keys = tuple(builder.schemas[schema])
        root = keys == (ROOT,)
        mapper = None if root else schema_mapper(schema)
        read = ROOT if root else (*keys, *builder.managed_of[schema])  # managed keys too
        readers.append(BranchReader(branch, read, mapper))
    return tuple(readers)
