"""The graphs a worker or coordinator process can run, loaded once at start.

A graph is known by its id, ``pkg.module:attr``. ``--graph pkg.module:attr`` loads one
compiled graph; ``--graph pkg.module`` loads every compiled graph the module defines at top
level. A message naming any other id is refused: nothing is imported after start, so no
message can make a process load code.

A subgraph added as a node is addressed by the path of node names leading to it, so every
node task of every nesting level has a name: ``<graph id>.<node>[.<node>…]`` — the Celery
task name Flower shows.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard

from bulksync.coordinator.spec import CompiledGraph, GraphSpec, RunnableGraph
from bulksync.errors import ConfigError, UnknownGraphError

_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*)?$")


def is_compiled_graph(value: Any) -> TypeGuard[RunnableGraph]:
    """Whether ``value`` is a compiled bulksync graph."""
    return isinstance(getattr(value, "spec", None), GraphSpec) and hasattr(value, "stream")


def task_name(graph_id: str, path: Sequence[str], node: str) -> str:
    """The Celery task name of a node's tasks: ``<graph id>.<node>`` (subgraph path between)."""
    return ".".join([graph_id, *path, node])


def spec_at(graph: CompiledGraph, path: Sequence[str]) -> GraphSpec:
    """The spec of the subgraph reached from ``graph`` through the subgraph nodes ``path``.

    Raises:
        UnknownGraphError: a name on the path is not a subgraph node.

    A subgraph compiled without a store gets the nearest enclosing graph's, as its loop
    would on the coordinator.
    """
    spec: GraphSpec = graph.spec
    for name in path:
        node = spec.nodes.get(name)
        if node is None or node.subgraph is None:
            raise UnknownGraphError(
                f"'{name}' is not a subgraph node of graph '{spec.name}' (path {list(path)}); "
                "the coordinator and worker loaded different versions of the graph module."
            )
        store = spec.store
        spec = node.subgraph.spec
        if spec.store is None and store is not None:
            spec = dataclasses.replace(spec, store=store)
    return spec


def walk_specs(
    graph: CompiledGraph, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], GraphSpec]]:
    """Every spec of ``graph`` and of its subgraph nodes, with the node path to each."""
    spec: GraphSpec = graph.spec
    yield path, spec
    for name, node in spec.nodes.items():
        if node.subgraph is not None:
            yield from walk_specs(node.subgraph, (*path, name))


class GraphRegistry:
    """Compiled graphs by id."""

    def __init__(self) -> None:
        self._graphs: dict[str, RunnableGraph] = {}

    def __contains__(self, graph_id: object) -> bool:
        return graph_id in self._graphs

    def ids(self) -> list[str]:
        """The ids loaded, sorted."""
        return sorted(self._graphs)

    def add(self, graph_id: str, graph: Any) -> None:
        """Register ``graph`` under ``graph_id``.

        Raises:
            TypeError: ``graph`` is not a compiled graph.
            ConfigError: another graph already has this id (a ``ValueError``).
        """
        if not is_compiled_graph(graph):
            raise TypeError(
                f"'{graph_id}' is a {type(graph).__name__}, not a compiled graph; point at the "
                "result of StateGraph(...).compile()."
            )
        known = self._graphs.get(graph_id)
        if known is not None and known is not graph:
            raise ConfigError(
                f"graph id '{graph_id}' is already registered to another graph; give each "
                "graph its own module attribute, or load the module once."
            )
        self._graphs[graph_id] = graph

    def load(self, ref: str) -> list[str]:
        """Import ``pkg.module[:attr]`` and register its graph(s); return the ids added.

        Raises:
            ConfigError: the reference is malformed, cannot be imported, or names no graph
                (a ``ValueError``).
        """
        if not _REF.match(ref):
            raise ConfigError(
                f"--graph {ref!r}: expected 'pkg.module' or 'pkg.module:attr' "
                "(e.g. bulksync.demo:graph)."
            )
        module_name, _, attr = ref.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(
                f"--graph {ref!r}: cannot import module '{module_name}' ({exc}); check the "
                "name and that it is installed or on PYTHONPATH."
            ) from exc
        if attr:
            if not hasattr(module, attr):
                raise ConfigError(
                    f"--graph {ref!r}: module '{module_name}' has no '{attr}'; check the "
                    "attribute name, or pass just the module to load all its compiled graphs."
                )
            found = {attr: getattr(module, attr)}
        else:
            found = {k: v for k, v in vars(module).items() if is_compiled_graph(v)}
            if not found:
                raise ConfigError(
                    f"--graph {ref!r}: module '{module_name}' defines no compiled graph at top "
                    "level; name one with 'pkg.module:attr'."
                )
        added = []
        for name, graph in sorted(found.items()):
            graph_id = f"{module_name}:{name}"
            self.add(graph_id, graph)
            added.append(graph_id)
        return added

    def get(self, graph_id: str) -> RunnableGraph:
        """The graph registered as ``graph_id``.

        Raises:
            UnknownGraphError: naming the graphs this process did load.
        """
        graph = self._graphs.get(graph_id)
        if graph is None:
            loaded = ", ".join(self.ids()) or "none"
            raise UnknownGraphError(
                f"graph '{graph_id}' is not loaded in this process (loaded: {loaded}); start "
                f"it with --graph {graph_id}. bulksync never imports a graph a message names."
            )
        return graph

    def spec(self, graph_id: str, path: Sequence[str] = ()) -> GraphSpec:
        """The spec of graph ``graph_id``, or of its subgraph at node path ``path``."""
        return spec_at(self.get(graph_id), path)

    def task_names(self) -> Iterator[str]:
        """The Celery task name of every node (all nesting levels) of every graph."""
        for graph_id in self.ids():
            for path, spec in walk_specs(self._graphs[graph_id]):
                for node in spec.nodes:
                    yield task_name(graph_id, path, node)
