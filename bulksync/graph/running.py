"""Running a compiled graph: ``invoke``, ``stream`` and ``start``, each run one ``SuperstepLoop``.

For ``stream``/``invoke`` the loop runs on the caller's thread, as LangGraph's does, and
streams ``(namespace, mode, chunk)`` events to it as they come (``inbox.Reading``): a step's
chunks before the next step's tasks start, and ``custom`` chunks and subgraph events while
the step is still running; ``start`` hands the loop to a ``Reactor`` instead, for a service
driving many runs at once. ``GraphRuns`` is mixed into ``CompiledStateGraph``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bulksync.checkpoint.base import CheckpointSaver, config_thread
from bulksync.config import addresses_own_thread, merge_configs
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, INTERRUPT, NS_SEP
from bulksync.context import maybe_current_task
from bulksync.coordinator.executor import Executor
from bulksync.coordinator.inbox import Chunks, Reading
from bulksync.coordinator.loop import Outcome, SuperstepLoop
from bulksync.coordinator.nested import ReplayState, invoke_nested, recast_namespace
from bulksync.coordinator.options import RunOptions, validate_recursion_limit
from bulksync.coordinator.reactor import Reactor
from bulksync.coordinator.spec import GraphSpec
from bulksync.coordinator.stream import (
    PAUSES,
    check_version,
    frame,
    stream_modes,
    stream_part,
)
from bulksync.graph.schema import schema_mapper
from bulksync.stream.events import drop_inherited_message_events
from bulksync.types import GraphOutput
from bulksync.workers.cancel_scope import current_home, current_scope, mark_async_caller
from bulksync.workers.tracing import RunCallbacks

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _Lifecycle:
    """A run's pause or resumption on its way to ``stream(lifecycle=...)``."""

    record: dict[str, Any]


_BETWEEN_STEPS = frozenset(("values", "updates", "checkpoints", "tasks", "debug", PAUSES))
"""Stream modes whose chunks come between steps: nothing a node streams while it runs."""


class GraphRuns:
    """The runs of a compiled graph (mixed into ``CompiledStateGraph``)."""

    if TYPE_CHECKING:  # what the mixin needs of the class it is mixed into
        builder: Any
        spec: GraphSpec
        checkpointer: CheckpointSaver | bool | None
        config: Mapping[str, Any] | None
        executor: Executor
        name: str
        debug: bool
        step_timeout: float | None
        interrupt_before: Sequence[str] | str
        interrupt_after: Sequence[str] | str

        @property
        def saver(self) -> CheckpointSaver | None: ...

    def invoke(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str = "values",
        output_keys: Sequence[str] | str | None = None,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        durability: str | None = None,
        version: str = "v1",
        **kwargs: Any,
    ) -> Any:
        """Run to the end (or a pause) and return the output values; with ``version="v2"``,
        a ``GraphOutput`` (or, for another ``stream_mode``, the list of typed parts)."""
        ctx = maybe_current_task()
        if ctx is not None and ctx.parent is not None and not addresses_own_thread(config):
            outcome: Outcome = invoke_nested(self, input, ctx, _stopped_with_caller)
            return outcome.output
        kw = dict(
            output_keys=output_keys if output_keys is not None else self.spec.output_channels,
            interrupt_before=interrupt_before,
            interrupt_after=interrupt_after,
            durability=durability,
            _read_by_invoke=True,  # (``stream``: nothing but this method sees its chunks)
            **kwargs,
        )
        if stream_mode != "values":
            return list(self.stream(input, config, stream_mode=stream_mode, version=version, **kw))
        if version == "v2":
            parts = list(self.stream(input, config, stream_mode="values", version="v2", **kw))
            value = parts[-1]["data"] if parts else None
            found = tuple(i for part in parts for i in part["interrupts"])
            return GraphOutput(value=value, interrupts=found)
        check_version(version)
        latest: Any = None
        interrupts: list[Any] = []
        for item in self.stream(input, config, stream_mode=[PAUSES, "values"], **kw):
            mode, chunk = item[-2:]  # (namespace, mode, chunk) with subgraphs=True
            if mode == PAUSES:  # the updates that carry interrupts, the only ones read
                interrupts.extend(chunk[INTERRUPT])
            elif mode == "values":
                latest = chunk
        if not interrupts:
            return latest
        if isinstance(latest, dict):
            return {**latest, INTERRUPT: interrupts}
        return {INTERRUPT: interrupts}

    def stream(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str | Sequence[str] | None = None,
        output_keys: Sequence[str] | str | None = None,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        durability: str | None = None,
        subgraphs: bool = False,
        debug: bool | None = None,
        version: str = "v1",
        context: Any = None,
        control: Any = None,
        lifecycle: Callable[[dict[str, Any]], None] | None = None,
        **kwargs: Any,
    ) -> Iterator[Any]:
        """Run and yield chunks as LangGraph frames them (see DESIGN.md §2); ``version="v2"``
        yields typed parts (``{"type", "ns", "data"}``) whatever the other arguments.

        ``control`` (a ``RunControl``) lets the caller, or a node through ``runtime.control``,
        stop the run cleanly between two steps. ``lifecycle`` is called, on the caller's
        thread and in order with the chunks, with a record of each time the run resumes or
        pauses (``tracing.lifecycle_record``): how a service tells a remote caller's
        lifecycle handlers.

        Raises:
            GraphDrained: the run stopped because ``control`` asked it to (its checkpoint is
                saved: invoke with ``None`` on the thread to go on).
        """
        check_version(version)
        modes, bare = stream_modes(stream_mode, bool(debug or (debug is None and self.debug)))
        chunks = Chunks()
        loop, reports = self._open_run(
            input,
            config,
            modes,
            subgraphs,
            chunks.put,
            output_keys=output_keys,
            interrupt_before=interrupt_before,
            interrupt_after=interrupt_after,
            durability=durability,
            context=context,
            control=control,
            lifecycle=lifecycle,
        )
        scope = current_scope()
        if scope is not None:  # run by a node (or read by astream): stopped with its caller
            scope.on_cancel(loop.abandon)
        loop.read_here = True
        loop.read_by_caller = not kwargs.get("_read_by_invoke", False)
        # As on LangGraph: a lone sync task runs on this thread, unless the caller reads
        # what nodes stream as they run (tokens, custom chunks, subgraphs' chunks).
        loop.blocking = not subgraphs and set(modes) <= _BETWEEN_STEPS
        reading = Reading(
            loop.steps(),
            chunks,
            lambda end: reports.paused(end.status, loop.checkpoint.id, end.interrupts),
        )
        items = reading.items()
        typed = self._part_maker() if version == "v2" else None
        ended = False
        try:
            while True:
                try:
                    item = next(items)
                except StopIteration as stop:
                    outcome: Outcome = stop.value
                    break
                except BaseException as exc:
                    if reading.waiting:  # this thread was interrupted: the run stops (below)
                        raise
                    ended = True
                    reports.failed(exc)
                    raise
                if isinstance(item, _Lifecycle):
                    lifecycle(item.record)  # type: ignore[misc]
                    continue
                ns, mode, chunk = item
                if (ns and not subgraphs) or mode not in modes:
                    continue
                if typed is not None:
                    yield typed(ns, mode, chunk)
                else:
                    yield frame(ns, mode, chunk, subgraphs=subgraphs, bare=bare)
            ended = True
            reports.ended(outcome.output)
        finally:
            if not ended:  # the caller broke off (or was cancelled): the run stops too
                loop.abandon()
                items.close()
                reading.finish_elsewhere(f"bulksync-run-{self.name}")
                reports.failed(asyncio.CancelledError())

    def start(
        self,
        input: Any,
        config: Mapping[str, Any] | None,
        reactor: Reactor,
        on_chunk: Callable[[tuple[str, ...], str, Any], None],
        on_end: Callable[[Outcome | None, BaseException | None], None],
        *,
        stream_mode: str | Sequence[str] | None = None,
        subgraphs: bool = False,
        lifecycle: Callable[[dict[str, Any]], None] | None = None,
        **options: Any,
    ) -> SuperstepLoop:
        """Start a run driven by ``reactor``, holding no thread while its tasks run: the
        coordinator service's way to drive many runs at once (``coordinator/reactor.py``).

        ``stream`` as callbacks, on reactor threads: ``on_chunk(namespace, mode, chunk)``
        gets what ``stream(subgraphs=True)`` would yield, unframed; then ``on_end`` gets the
        run's ``Outcome``, or the error ``stream`` would raise. ``lifecycle`` and
        ``options`` are ``stream``'s. The loop is returned, to ``abandon`` the run.
        """
        modes, _ = stream_modes(stream_mode, bool(self.debug))

        def put(item: Any) -> None:
            if isinstance(item, _Lifecycle):
                lifecycle(item.record)  # type: ignore[misc]
                return
            ns, mode, chunk = item
            if (subgraphs or not ns) and mode in modes:
                on_chunk(ns, mode, chunk)

        loop, reports = self._open_run(
            input, config, modes, subgraphs, put, lifecycle=lifecycle, **options
        )

        def done(outcome: Outcome | None, error: BaseException | None) -> None:
            if outcome is not None:
                reports.paused(outcome.status, loop.checkpoint.id, outcome.interrupts)
                reports.ended(outcome.output)
            elif error is not None:
                reports.failed(error)
            on_end(outcome, error)

        reactor.start(loop.steps(), done)
        return loop

    def _open_run(
        self,
        input: Any,
        config: Mapping[str, Any] | None,
        modes: Sequence[str],
        subgraphs: bool,
        put: Callable[[Any], None],
        *,
        output_keys: Sequence[str] | str | None = None,
        interrupt_before: Sequence[str] | str | None = None,
        interrupt_after: Sequence[str] | str | None = None,
        durability: str | None = None,
        context: Any = None,
        control: Any = None,
        lifecycle: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[SuperstepLoop, RunCallbacks]:
        """The loop of one run, and the run's callbacks: ``put`` gets every
        ``(namespace, mode, chunk)`` it streams, and each ``_Lifecycle`` record."""
        upstream, forwarded = _caller_upstream(config)
        config, replay = self._into_subgraph(self._run_config(config))
        _check_run_arguments(self.spec, durability, interrupt_before, interrupt_after)
        relay = None if lifecycle is None else lambda record: put(_Lifecycle(record))
        # To the config's handlers, if any, and to ``lifecycle``.
        reports = RunCallbacks(config, self.name, input, relay)
        options = RunOptions(
            config=config,
            recursion_limit=validate_recursion_limit(config["recursion_limit"]),
            durability=durability or "async",
            interrupt_before=_given(interrupt_before, self.interrupt_before),
            interrupt_after=_given(interrupt_after, self.interrupt_after),
            output_keys=output_keys if output_keys is not None else self.spec.stream_channels,
            modes=frozenset(modes) | forwarded,
            subgraphs=subgraphs,
            context=_as_context(self.builder.context_schema, context),
            control=control,
            step_timeout=self.step_timeout,
            on_resume=reports.on_resume(),
        )

        def sink(ns: tuple[str, ...], mode: str, chunk: Any) -> None:
            if mode in forwarded:
                upstream(ns, mode, chunk)
            put((ns, mode, chunk))

        loop = SuperstepLoop(
            self.spec,
            input,
            saver=self.saver,
            executor=self.executor,
            options=options,
            sink=sink,
            replay=replay,
            home=current_home(),  # an async caller's loop runs the async nodes
        )
        return loop, reports

    def _part_maker(self) -> Callable[[tuple[str, ...], str, Any], dict[str, Any]]:
        """v2 parts of this graph: values as its output schema, checkpoints as its state's."""
        builder = self.builder
        # An entrypoint's schemas (``Any`` and the like) have no keys: its values stay as is.
        output = _coercer(builder.output_schema, builder.schemas.get(builder.output_schema, ()))
        state = _coercer(builder.state_schema, builder.schemas.get(builder.state_schema, ()))

        def part(ns: tuple[str, ...], mode: str, chunk: Any) -> dict[str, Any]:
            # A subgraph's parts are left as they come: they hold its own schema's values.
            if ns:
                return stream_part(ns, mode, chunk)
            return stream_part(ns, mode, chunk, output=output, state=state)

        return part

    def _into_subgraph(self, config: dict[str, Any]) -> tuple[dict[str, Any], ReplayState | None]:
        """A run addressed to a subgraph's checkpoint (time travel into it): the root's
        config at the parent checkpoint that subgraph checkpoint belongs to, and the replay
        that pins the subgraph (and each graph between) to its checkpoint of then."""
        conf = config["configurable"]
        ns, checkpoint_id = conf.get(CHECKPOINT_NS), conf.get(CHECKPOINT_ID)
        if not ns or not checkpoint_id or self.saver is None:
            return config, None
        saved = self.saver.get_tuple(config)
        parents = dict((saved.metadata.get("parents") or {}) if saved is not None else {})
        root_id = parents.pop("", None)
        if root_id is None:
            return config, None
        pins = {recast_namespace(p): c for p, c in parents.items()}
        pins[recast_namespace(ns)] = checkpoint_id
        root = {**conf, CHECKPOINT_NS: "", CHECKPOINT_ID: root_id}
        return {**config, "configurable": root}, ReplayState(root_id, pins)

    def _run_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        merged: dict[str, Any] = merge_configs(self.config, config)
        merged.setdefault("recursion_limit", _default_recursion_limit())
        merged["configurable"] = dict(merged.get("configurable") or {})
        merged["metadata"] = dict(merged.get("metadata") or {})
        for key in METADATA_FROM_CONFIGURABLE:  # what LangGraph shows in every run's metadata
            if merged["configurable"].get(key):
                merged["metadata"].setdefault(key, merged["configurable"][key])
        drop_inherited_message_events(merged["configurable"])
        mark_async_caller(merged["configurable"], inherited=maybe_current_task() is not None)
        if self.saver is not None:
            config_thread(merged)
        return merged


DURABILITIES = ("sync", "async", "exit")


def _caller_upstream(config: Mapping[str, Any] | None) -> tuple[Any, frozenset[str]]:
    """For a graph streamed from a node, when the calling run reads its subgraphs' events:
    where this run's events go besides its own caller, and which modes go there.

    As in LangGraph, a graph run on a thread of its own hands the calling run the events of
    its models and tools (``messages``, ``tools``, through the handlers it inherits), at
    its own namespaces; any other is the node's subgraph, whose events of every mode the
    calling run takes reach it under the node's namespace. Outside a node, or when the
    caller reads only its own graph's events: none.
    """
    ctx = maybe_current_task()
    if ctx is None or ctx.parent is None:
        return None, frozenset()
    step, live, task = ctx.parent
    if step.nesting is None or not step.nesting.subgraphs:
        return None, frozenset()
    if addresses_own_thread(config):
        return live.sink, frozenset(step.nesting.modes) & {"messages", "tools"}
    prefix = tuple(task.checkpoint_ns.split(NS_SEP))

    def under_node(ns: tuple[str, ...], mode: str, chunk: Any) -> None:
        live.sink(prefix + ns, mode, chunk)

    return under_node, frozenset(step.nesting.modes)


def _as_context(schema: Any, context: Any) -> Any:
    """``context`` as the graph's ``context_schema`` takes it: a dict given for a dataclass or
    pydantic schema becomes an instance (its ``TypeError``/``ValidationError`` if it cannot)."""
    mapper = schema_mapper(schema) if isinstance(context, dict) else None
    return mapper(context) if mapper is not None else context


def _stopped_with_caller(loop: SuperstepLoop) -> None:
    """A graph a node invokes stops when its caller is stopped (``cancel_scope.py``)."""
    scope = current_scope()
    if scope is not None:
        scope.on_cancel(loop.halt)


METADATA_FROM_CONFIGURABLE = (
    "thread_id",
    "checkpoint_id",
    "checkpoint_ns",
    "task_id",
    "run_id",
    "assistant_id",
    "graph_id",
)
"""``configurable`` keys copied into a run's ``metadata`` (where chat models' stream
metadata and callback events show them), unless the metadata has them already."""


def _coercer(schema: Any, keys: Iterable[str]) -> Callable[[Any], Any] | None:
    """For a dataclass or pydantic ``schema``: a dict of values, as an instance of it (only
    its own ``keys`` given); None for other schemas, whose values stay dicts."""
    mapper = schema_mapper(schema)
    if mapper is None:
        return None
    own = tuple(keys)

    def coerce(values: Any) -> Any:
        return mapper({k: values[k] for k in own if k in values})

    return coerce


def _check_run_arguments(
    spec: GraphSpec,
    durability: str | None,
    before: Sequence[str] | str | None,
    after: Sequence[str] | str | None,
) -> None:
    """Warn, naming the argument, about a value LangGraph accepts silently.

    LangGraph runs ``durability="sometimes"`` as "async" and never pauses at an unknown
    ``interrupt_before``/``interrupt_after`` node given to a run (``compile`` rejects them);
    bulksync does the same, so programs written for it keep working, and says so in the log.
    """
    if durability is not None and durability not in DURABILITIES:
        log.warning(
            "graph %s: durability=%r is not one of %s; the run checkpoints as with 'async'",
            spec.name,
            durability,
            ", ".join(DURABILITIES),
        )
    for name, nodes in (("interrupt_before", before), ("interrupt_after", after)):
        if nodes is None or nodes == "*":
            continue
        unknown = [n for n in ([nodes] if isinstance(nodes, str) else nodes) if n not in spec.nodes]
        if unknown:
            log.warning(
                "graph %s: %s names no node of the graph: %s (nodes: %s); the run never "
                "pauses there",
                spec.name,
                name,
                ", ".join(map(repr, unknown)),
                ", ".join(spec.nodes),
            )


def _given(value: Sequence[str] | str | None, default: Sequence[str] | str) -> Sequence[str] | str:
    return default if value is None else value


def _default_recursion_limit() -> int:
    value = os.environ.get("LANGGRAPH_DEFAULT_RECURSION_LIMIT")
    return int(value) if value else 10007
