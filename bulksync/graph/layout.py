"""The layout of ``get_graph()``: the edges LangGraph would draw for a ``StateGraph``.

LangGraph does not draw the declared edges; it simulates which triggers each node's writes
fire and draws what it finds. This module repeats that simulation over the compiled spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bulksync.channels.base import MISSING
from bulksync.constants import END, START
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.graph.state import StateGraph, build_spec
from bulksync.graph.writers import branch_channel, trigger_layout

if TYPE_CHECKING:
    from bulksync.graph.drawing import DrawableGraph, DrawEdge


def builder_drawable(
    builder: StateGraph[Any], spec: GraphSpec | None = None, *, xray: bool | int = False
) -> DrawableGraph:
    """The drawing LangGraph's ``get_graph()`` makes of ``builder`` (compiled as ``spec``).

    ``xray`` draws subgraph nodes as their own nodes and edges: all levels when True, that
    many levels when a number.

    Like LangGraph, it runs the graph on its triggers alone: each node fires its static edges,
    and declares its conditional ones (path maps, ``destinations``, ``Command[Literal]``
    returns) once; an edge is drawn from each writer of a trigger to the node it wakes.
    A conditional edge with no path map therefore draws nothing.
    """
    from bulksync.graph.drawing import DrawableGraph

    spec = spec if spec is not None else build_spec(builder)
    _, _, regular = trigger_layout(builder)
    declared = {key: _declared_writes(builder, key) for key in regular}
    edges, last_step = _TriggerRun(spec).discover(regular, declared)
    metadata: dict[str, dict[str, object]] = {}
    for key, node in builder.nodes.items():
        meta: dict[str, object] = dict(node.metadata or {})
        if node.defer:
            meta["defer"] = True
        # "*" is a str, so `in` tests for a substring there, as in LangGraph: no node matches.
        when = [
            w
            for w, nodes in (("before", spec.interrupt_before), ("after", spec.interrupt_after))
            if key in nodes
        ]
        if when:
            meta["__interrupt"] = ",".join(when)
        tools = getattr(node.action, "tools_by_name", None)
        if isinstance(tools, Mapping) and tools:
            meta["__tools"] = list(tools)
        if meta:
            metadata[key] = meta
    drawing = DrawableGraph.assemble(
        list(spec.nodes), edges, metadata=metadata, last_step_nodes=last_step
    )
    if not xray:
        return drawing
    deeper = xray if isinstance(xray, bool) else xray - 1
    for key, node in builder.nodes.items():
        sub = node.subgraph
        if sub is not None:
            inner = builder_drawable(sub.builder, sub.spec, xray=deeper)
            drawing = drawing.with_subgraph(key, inner)
    return drawing


_Declared = list[list[tuple[str, str | None]]]
_Trigger = tuple[str, bool, str | None]  # (channel or source node, conditional, label)


def _declared_writes(builder: StateGraph[Any], key: str) -> _Declared:
    """Per writer of ``key`` (its destinations, then each mapped branch): target, label."""
    groups: _Declared = []
    node = builder.nodes.get(key)
    if node is not None and node.ends:
        pairs = node.ends.items() if isinstance(node.ends, dict) else ((e, None) for e in node.ends)
        groups.append([(_channel_or_end(e), label) for e, label in pairs])
    for branch in builder.branches.get(key, {}).values():
        if branch.ends:
            groups.append([(_channel_or_end(e), str(k)) for k, e in branch.ends.items()])
    return groups


def _channel_or_end(target: str) -> str:
    return target if target == END else branch_channel(target)


class _TriggerRun:
    """LangGraph's ``draw_graph`` loop: supersteps over the trigger channels only."""

    LIMIT = 250

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec
        self.live = {c: spec.channels[c].from_checkpoint(MISSING) for c in spec.trigger_to_nodes}
        self.versions: dict[str, int] = {}
        self.seen: dict[str, dict[str, int]] = {}
        self.edges: set[DrawEdge] = set()
        self.sources: dict[str, set[_Trigger]] = {}  # node -> what it wrote, latest run
        self.declared: dict[str, set[_Trigger]] = {}  # node -> conditional writes it declared
        self.used: set[tuple[str, int]] = set()  # declared groups already applied

    def discover(
        self, regular: Mapping[str, list[Write]], declared: Mapping[str, _Declared]
    ) -> tuple[set[DrawEdge], list[str]]:
        """The edges found and the nodes that ran in the last simulated step."""
        step_sources: dict[str, set[_Trigger]] = {}
        tasks = self._plan(self._apply([], {START: [(START, {})]}))
        for _ in range(self.LIMIT + 1):
            if not tasks:
                break
            writes, conditional = self._step_writes(tasks, regular, declared)
            step_sources = {
                task: {
                    (c, (task, c) in conditional and v is None, conditional.get((task, c)))
                    for c, v in writes[task]
                }
                | self.declared.get(task, set())
                for task in tasks
            }
            self.sources.update(step_sources)
            by_trigger: dict[str, set[_Trigger]] = {}
            for source, found in self.sources.items():
                for channel, cond, label in found:
                    by_trigger.setdefault(channel, set()).add((source, cond, label))
            tasks = self._plan(self._apply(tasks, writes))
            for task in tasks:
                self._draw_wake(task, by_trigger, step_sources)
        return self.edges, list(step_sources)

    def _step_writes(
        self,
        tasks: list[str],
        regular: Mapping[str, list[Write]],
        declared: Mapping[str, _Declared],
    ) -> tuple[dict[str, list[Write]], dict[tuple[str, str], str | None]]:
        """Each task's writes: its static edges, plus its declared ones on its first run."""
        from bulksync.graph.drawing import DrawEdge

        writes: dict[str, list[Write]] = {}
        conditional: dict[tuple[str, str], str | None] = {}
        for task in tasks:
            writes[task] = list(regular[task])
            for index, group in enumerate(declared[task]):
                if (task, index) in self.used:
                    continue
                self.used.add((task, index))
                for channel, label in group:
                    if channel == END:
                        self.edges.add(DrawEdge(task, END, True, label))
                        continue
                    conditional[(task, channel)] = label
                    self.declared.setdefault(task, set()).add((channel, True, label))
                    writes[task].append((channel, None))
        return writes, conditional

    def _draw_wake(
        self,
        task: str,
        by_trigger: Mapping[str, set[_Trigger]],
        step_sources: Mapping[str, set[_Trigger]],
    ) -> None:
        """Edges into ``task`` from every writer of its triggers (all last-step nodes if none)."""
        from bulksync.graph.drawing import DrawEdge

        added = False
        for trigger in self.spec.nodes[task].triggers:
            for source, cond, label in sorted(by_trigger.get(trigger, ()), key=_sort_key):
                self.edges.add(DrawEdge(source, task, cond, label))
                if (trigger, cond, label) in step_sources.get(source, ()):
                    added = True
                else:
                    self.sources[source].discard((trigger, cond, label))
        if not added:
            self.edges.update(DrawEdge(source, task, True, None) for source in step_sources)

    def _plan(self, updated: set[str]) -> list[str]:
        if updated:
            woken = {n for c in updated for n in self.spec.trigger_to_nodes.get(c, ())}
            candidates: list[str] = sorted(woken)
        else:
            candidates = list(self.spec.nodes)
        return [n for n in candidates if self._fires(n)]

    def _fires(self, node: str) -> bool:
        seen = self.seen.get(node)
        return any(
            self.live[c].is_available()
            and (seen is None or self.versions.get(c, 0) > seen.get(c, 0))
            for c in self.spec.nodes[node].triggers
        )

    def _apply(self, tasks: list[str], writes: Mapping[str, list[Write]]) -> set[str]:
        """LangGraph's ``apply_writes``, restricted to trigger channels."""
        bump = bool(tasks)
        for task in tasks:
            mine = self.spec.nodes[task].triggers
            self.seen.setdefault(task, {}).update(
                {c: self.versions[c] for c in mine if c in self.versions}
            )
        version = max(self.versions.values(), default=0) + 1
        updated: set[str] = set()

        def bumped(channel: str, changed: bool) -> None:
            if changed:
                self.versions[channel] = version
                if self.live[channel].is_available():
                    updated.add(channel)

        for channel in sorted({c for task in tasks for c in self.spec.nodes[task].triggers}):
            if self.live[channel].consume():
                self.versions[channel] = version
        grouped: dict[str, list[Any]] = {}
        for task in sorted(writes):
            for channel, value in writes[task]:
                if channel in self.live:
                    grouped.setdefault(channel, []).append(value)
        for channel, values in grouped.items():
            bumped(channel, self.live[channel].update(values))
        if bump:
            for channel, live in self.live.items():
                if live.is_available() and channel not in updated:
                    bumped(channel, live.update([]))
            if updated.isdisjoint(self.spec.trigger_to_nodes):
                for channel, live in self.live.items():
                    bumped(channel, live.finish())
        return updated


def _sort_key(found: tuple[str, bool, str | None]) -> tuple[str, bool, bool, str]:
    source, cond, label = found
    return (source, cond, label is not None, label or "")
