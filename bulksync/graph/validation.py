"""Checks of a ``StateGraph``'s structure, run by ``validate()`` and ``compile()``.

Stricter than LangGraph's on one point: a node that nothing can reach from START is an
error. Reachability is a heuristic: a node whose routing cannot be known statically (a
``Command`` return without ``destinations`` or a ``Literal`` annotation, a branch without a
path_map, a subgraph) counts as able to reach any node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bulksync.constants import END, START
from bulksync.errors import InvalidGraphError
from bulksync.graph.writers import error_handler_name

if TYPE_CHECKING:
    from bulksync.graph.state import StateGraph


def check_structure(builder: StateGraph[Any], interrupt: Sequence[str]) -> None:
    """LangGraph's checks: known edge ends, an entry point, known breakpoints."""
    nodes = builder.nodes
    joins = [(s, e) for starts, e in builder.waiting_edges_in_order for s in starts]
    edges = [*builder.edges_in_order, *joins]
    sources = [s for s, _ in edges] + list(builder.branches) + [n for n in nodes if nodes[n].ends]
    for source in sources:
        if source not in nodes and source != START:
            raise InvalidGraphError(
                f"Found edge starting at unknown node '{source}'; add it with "
                f"add_node('{source}', ...) or remove the edge."
            )
    if START not in sources:
        raise InvalidGraphError(
            "Graph must have an entrypoint: add at least one edge from START to another node"
        )
    targets = [e for _, e in edges] + [end for n in nodes for end in nodes[n].ends]
    for start, branches in builder.branches.items():
        for cond, branch in branches.items():
            for end in (branch.ends or {}).values():
                if end not in nodes and end != END:
                    raise InvalidGraphError(
                        f"At '{start}' node, '{cond}' branch found unknown target '{end}'; "
                        "fix its path_map or add the node."
                    )
    for target in targets:
        if target not in nodes and target != END:
            raise InvalidGraphError(
                f"Found edge ending at unknown node `{target}`; add it with add_node first."
            )
    default = builder.node_defaults.get("error_handler") is not None
    handlers = {
        error_handler_name(name, own=node.error_handler is not None)
        for name, node in nodes.items()
        if node.error_handler is not None or default
    }
    for name in interrupt:
        if name not in nodes and name not in handlers:
            raise InvalidGraphError(f"Interrupt node `{name}` not found")


def check_reachable(builder: StateGraph[Any]) -> None:
    """Raise for nodes no path from START can reach (LangGraph would silently never run them)."""
    successors: dict[str, set[str]] = {key: set() for key in (START, *builder.nodes)}
    anywhere = {key for key, node in builder.nodes.items() if node.routes_anywhere}
    for start, end in builder.edges_in_order:
        successors.setdefault(start, set()).add(end)
    for starts, end in builder.waiting_edges_in_order:
        for start in starts:
            successors[start].add(end)
    for source, branches in builder.branches.items():
        for branch in branches.values():
            if branch.ends is None:
                anywhere.add(source)
            else:
                successors.setdefault(source, set()).update(branch.ends.values())
    for key, node in builder.nodes.items():
        successors[key].update(node.ends)
    reached, frontier = {START}, [START]
    while frontier:
        current = frontier.pop()
        if current in anywhere:
            return
        for target in successors.get(current, ()):
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    lost = [key for key in builder.nodes if key not in reached]
    if lost:
        raise InvalidGraphError(
            f"Node(s) {lost} cannot be reached from START: no edge, conditional edge or "
            "declared destination leads there. Connect them with add_edge or a conditional "
            "edge's path_map; for a node whose Command(goto=...) goes there, pass "
            "add_node(..., destinations=...) or annotate it -> Command[Literal[...]]; or remove "
            "them."
        )
