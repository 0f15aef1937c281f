"""A compiled graph's drawing: nodes and edges, rendered as Mermaid text identical to LangGraph's.

``DrawableGraph`` plays the part of the graph ``get_graph()`` returns in LangGraph, minus the
runnables: it holds node names, per-node metadata and edges in drawing order, and
``draw_mermaid`` renders them as langchain_core does, character for character (the front-matter
header, ``:::first``/``:::last`` for the single source and sink, ``-->`` for plain edges,
``-.->`` for conditional ones, labels, ``subgraph`` blocks for ``parent:child`` names, the
``classDef`` lines).

``DrawableGraph.assemble`` applies the rules LangGraph's ``get_graph`` uses to turn the edges it
discovers into that order (sorted, one edge per node pair, ``__end__`` edges from dead ends), so
the builder only has to discover the edges.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from bulksync.constants import END, START
from bulksync.errors import ConfigError, InvalidGraphError

__all__ = ("DrawEdge", "DrawableGraph", "NodeStyles")

CURVE_STYLES: Final = frozenset(
    {
        "basis",
        "bumpX",
        "bumpY",
        "cardinal",
        "catmullRom",
        "linear",
        "monotoneX",
        "monotoneY",
        "natural",
        "step",
        "stepAfter",
        "stepBefore",
    }
)
"""Values Mermaid accepts for ``flowchart.curve`` (langchain_core's ``CurveStyle``)."""

# Node names starting and ending with one of these would read as Markdown, so they are wrapped.
_MARKDOWN_CHARS: Final = tuple("*_`")
_SAFE_ID_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-")
_LABEL_ESCAPES: Final = (
    ("#", "#35;"),  # first, so the entities added below are not escaped again
    ("[", "#91;"),
    ("]", "#93;"),
    ("(", "#40;"),
    (")", "#41;"),
    ("{", "#123;"),
    ("}", "#125;"),
    ('"', "#quot;"),
    ("<", "#60;"),
    (">", "#62;"),
    ("|", "#124;"),
)


@dataclass(frozen=True, slots=True, order=True)
class DrawEdge:
    """An edge to draw: dotted when ``conditional``, captioned with ``label`` when given."""

    source: str
    target: str
    conditional: bool = False
    label: str | None = None


@dataclass(frozen=True, slots=True)
class NodeStyles:
    """The ``classDef`` styles of ordinary, first and last nodes (langchain_core's defaults)."""

    default: str = "fill:#f2f0ff,line-height:1.2"
    first: str = "fill-opacity:0"
    last: str = "fill:#bfb6fc"


class DrawableGraph:
    """Nodes and edges in drawing order, with optional metadata shown under a node's name."""

    __slots__ = ("nodes", "edges", "metadata")

    nodes: tuple[str, ...]
    edges: tuple[DrawEdge, ...]
    metadata: dict[str, dict[str, object]]

    def __init__(
        self,
        nodes: Sequence[str],
        edges: Sequence[DrawEdge],
        *,
        metadata: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        """Keep ``nodes`` and ``edges`` as given; every edge end must be one of ``nodes``.

        Raises:
            InvalidGraphError: a node is listed twice, or an edge or metadata names an unknown node.
        """
        self.nodes = tuple(nodes)
        self.edges = tuple(edges)
        self.metadata = {name: dict(meta) for name, meta in (metadata or {}).items()}
        _check(self.nodes, self.edges, self.metadata)

    def __repr__(self) -> str:
        return f"DrawableGraph(nodes={self.nodes!r}, edges={self.edges!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DrawableGraph):
            return NotImplemented
        return (self.nodes, self.edges, self.metadata) == (other.nodes, other.edges, other.metadata)

    @classmethod
    def assemble(
        cls,
        nodes: Sequence[str],
        edges: Iterable[DrawEdge],
        *,
        metadata: Mapping[str, Mapping[str, object]] | None = None,
        last_step_nodes: Sequence[str] = (),
    ) -> DrawableGraph:
        """Lay out discovered edges the way LangGraph's ``get_graph`` does.

        ``nodes`` are the graph's nodes in the order they were added (``__start__`` goes first
        if missing; ``__end__`` goes last, and only when an edge reaches it). ``edges`` may repeat
        and come in any order: they are sorted, only the first edge between two nodes is kept,
        and a label equal to its target is dropped. A plain edge into ``__end__`` is ignored, as
        LangGraph ignores it: ``__end__`` is reached by conditional edges (from branches), by a
        plain edge from every node some edge enters and none leaves, and, when neither exists, by
        a conditional edge from the node of ``last_step_nodes`` (those that ran in the last
        simulated step) if it is the only one.
        """
        found = sorted({e for e in edges if e.target != END or e.conditional}, key=_edge_key)
        laid: dict[tuple[str, str], DrawEdge] = {}
        for e in found:
            label = None if e.label == e.target else e.label
            laid.setdefault((e.source, e.target), dataclasses.replace(e, label=label))
        sources = {e.source for e in found}
        ends = [DrawEdge(t, END) for t in sorted({e.target for e in found} - sources - {END})]
        if not ends and not any(e.target == END for e in found) and len(set(last_step_nodes)) == 1:
            ends = [DrawEdge(last_step_nodes[0], END, conditional=True)]
        for e in ends:
            laid.setdefault((e.source, e.target), e)
        names = [n for n in nodes if n not in (START, END)]
        names = (
            [START, *names, END] if any(e.target == END for e in laid.values()) else [START, *names]
        )
        return cls(names, list(laid.values()), metadata=metadata)

    def first_node(self, exclude: Collection[str] = ()) -> str | None:
        """The one node no edge enters, or None when there are none or several (``exclude``:
        nodes, and their edges, to leave out)."""
        targets = {e.target for e in self.edges if e.source not in exclude}
        found = [n for n in self.nodes if n not in exclude and n not in targets]
        return found[0] if len(found) == 1 else None

    def last_node(self, exclude: Collection[str] = ()) -> str | None:
        """The one node no edge leaves, or None when there are none or several (``exclude``:
        nodes, and their edges, to leave out)."""
        sources = {e.source for e in self.edges if e.target not in exclude}
        found = [n for n in self.nodes if n not in exclude and n not in sources]
        return found[0] if len(found) == 1 else None

    def with_subgraph(self, name: str, sub: DrawableGraph) -> DrawableGraph:
        """This drawing with node ``name`` replaced by the drawing ``sub`` of its subgraph, as
        ``get_graph(xray=…)`` shows it: ``sub``'s nodes named ``name:<node>``, without its
        ``__start__``/``__end__`` where the subgraph still has a single first/last node
        without them, edges into ``name`` going to its first node and edges out of ``name``
        leaving from its last. A subgraph without one first and one last node stays a node.
        """
        if len(sub.nodes) < 2 or name not in self.nodes:
            return self
        first, last = sub.first_node(), sub.last_node()
        if first is None or last is None:
            return self
        dropped = {
            n for n, one in ((first, sub.first_node([first])), (last, sub.last_node([last]))) if one
        }
        inner = [n for n in sub.nodes if n not in dropped]
        inner_edges = [e for e in sub.edges if e.source not in dropped and e.target not in dropped]
        kept = DrawableGraph(inner, inner_edges)
        entry, exit_ = kept.first_node(), kept.last_node()

        def prefixed(node: str) -> str:
            return f"{name}:{node}"

        edges = [
            dataclasses.replace(
                e,
                source=prefixed(exit_) if e.source == name and exit_ else e.source,
                target=prefixed(entry) if e.target == name and entry else e.target,
            )
            for e in self.edges
        ]
        edges += [
            dataclasses.replace(e, source=prefixed(e.source), target=prefixed(e.target))
            for e in inner_edges
        ]
        metadata = {n: m for n, m in self.metadata.items() if n != name}
        metadata.update({prefixed(n): m for n, m in sub.metadata.items() if n in inner})
        nodes = [n for n in self.nodes if n != name] + [prefixed(n) for n in inner]
        return DrawableGraph(nodes, edges, metadata=metadata)

    def draw_mermaid(
        self,
        *,
        with_styles: bool = True,
        curve_style: str | Enum = "linear",
        node_colors: NodeStyles | None = None,
        wrap_label_n_words: int = 9,
    ) -> str:
        """Render as Mermaid flowchart text, the same as LangGraph's ``draw_mermaid``.

        Raises:
            ConfigError: ``curve_style`` is not a Mermaid curve (a ``ValueError``).
            ValueError: two subgraphs share a name (LangGraph's error there).
        """
        curve = curve_style.value if isinstance(curve_style, Enum) else curve_style
        if curve not in CURVE_STYLES:
            raise ConfigError(
                f"draw_mermaid: unknown curve_style {curve!r}; use one of {sorted(CURVE_STYLES)}."
            )
        writer = _MermaidWriter(self, with_styles, wrap_label_n_words)
        return writer.write(curve, node_colors or NodeStyles())


def _edge_key(edge: DrawEdge) -> tuple[str, str, bool, bool, str]:
    # LangGraph sorts (source, target, conditional, label) tuples; None sorts before any label
    # here, where comparing None with a string would fail there.
    return (edge.source, edge.target, edge.conditional, edge.label is not None, edge.label or "")


def _check(
    nodes: tuple[str, ...], edges: tuple[DrawEdge, ...], metadata: Mapping[str, object]
) -> None:
    """Raise InvalidGraphError if the drawing refers to nodes it does not have."""
    known = set(nodes)
    if len(known) != len(nodes):
        twice = sorted({n for n in nodes if nodes.count(n) > 1})
        raise InvalidGraphError(f"DrawableGraph: nodes {twice} are listed more than once.")
    for e in edges:
        for end in (e.source, e.target):
            if end not in known:
                raise InvalidGraphError(
                    f"DrawableGraph: edge {e.source!r} -> {e.target!r} names unknown node "
                    f"{end!r}; list it in nodes (including '{START}'/'{END}' when used)."
                )
    for name in metadata:
        if name not in known:
            raise InvalidGraphError(f"DrawableGraph: metadata given for unknown node {name!r}.")


class _MermaidWriter:
    """Renders one DrawableGraph; holds the grouping and the output of a single draw."""

    def __init__(self, graph: DrawableGraph, with_styles: bool, wrap_words: int) -> None:
        if wrap_words < 1:
            raise ConfigError(
                f"draw_mermaid: wrap_label_n_words must be >= 1, got {wrap_words}; pass 1 or more "
                "(the default is 9)."
            )
        self.graph = graph
        self.with_styles = with_styles
        self.wrap_words = wrap_words
        self.out: list[str] = []
        self.first = graph.first_node()
        self.last = graph.last_node()
        self.seen: set[str] = set()
        # A name "parent:child" is drawn inside the subgraph block of its prefix "parent".
        self.nested: dict[str, list[str]] = {}
        for name in graph.nodes:
            if ":" in name:
                self.nested.setdefault(name.rsplit(":", 1)[0], []).append(name)
        # An edge belongs to the block named by the path segments its two ends share.
        self.groups: dict[str, list[DrawEdge]] = {}
        for e in graph.edges:
            pairs = zip(e.source.split(":"), e.target.split(":"), strict=False)
            shared = ":".join(s for s, t in pairs if s == t)
            self.groups.setdefault(shared, []).append(e)

    def write(self, curve: str, styles: NodeStyles) -> str:
        """Return the whole Mermaid text: header, nodes, edges and blocks, then styles."""
        if self.with_styles:
            self.out.append(f"---\nconfig:\n  flowchart:\n    curve: {curve}\n---\ngraph TD;\n")
            for name in self.graph.nodes:
                if ":" not in name:
                    self._node(name)
        else:
            self.out.append("graph TD;\n")
        self._block(self.groups.get("", []), "")
        for prefix, edges in self.groups.items():
            if prefix and ":" not in prefix:
                self._block(edges, prefix)
                self.seen.add(prefix)
        if self.with_styles:
            # Blocks with no edge inside still show their nodes.
            for prefix, names in self.nested.items():
                if ":" not in prefix and prefix not in self.seen:
                    self.out.append(f"\tsubgraph {prefix}\n")
                    for name in names:
                        self._node(name)
                    self.out.append("\tend\n")
                    self.seen.add(prefix)
            for cls, style in (
                ("default", styles.default),
                ("first", styles.first),
                ("last", styles.last),
            ):
                self.out.append(f"\tclassDef {cls} {style}\n")
        return "".join(self.out)

    def _block(self, edges: list[DrawEdge], prefix: str) -> None:
        """Write the edges of ``prefix`` and, recursively, its child blocks."""
        # A lone self-loop is drawn in place, not wrapped in a block of its own.
        framed = bool(prefix) and not (len(edges) == 1 and edges[0].source == edges[0].target)
        if framed:
            name = prefix.rsplit(":", 1)[-1]
            if name in self.seen:
                # LangGraph (langchain_core) raises a bare ValueError for the same graph.
                raise ValueError(
                    f"draw_mermaid: two subgraphs are named {name!r}; give the nodes that hold "
                    "subgraphs distinct names."
                )
            self.seen.add(name)
            self.out.append(f"\tsubgraph {name}\n")
            if self.with_styles:
                for node in self.nested.get(prefix, []):
                    self._node(node)
        for e in edges:
            self.out.append(f"\t{_safe_id(e.source)}{self._arrow(e)}{_safe_id(e.target)};\n")
        for child, child_edges in self.groups.items():
            rest = child[len(prefix) + 1 :]
            if child.startswith(prefix + ":") and child != prefix and ":" not in rest:
                self._block(child_edges, child)
        if framed:
            self.out.append("\tend\n")

    def _node(self, name: str) -> None:
        short = name.split(":")[-1]
        markdown = short.startswith(_MARKDOWN_CHARS) and short.endswith(_MARKDOWN_CHARS)
        label = f"<p>{short}</p>" if markdown else short
        lines = _metadata_lines(self.graph.metadata.get(name, {}))
        if lines:
            label = f"{label}<hr/><small><em>" + "\n".join(lines) + "</em></small>"
        safe = _safe_id(name)
        if name == self.last:
            self.out.append(f"\t{safe}([{label}]):::last\n")
        elif name == self.first:
            self.out.append(f"\t{safe}([{label}]):::first\n")
        else:
            self.out.append(f"\t{safe}({label})\n")

    def _arrow(self, edge: DrawEdge) -> str:
        if edge.label is None:
            return " -.-> " if edge.conditional else " --> "
        text = edge.label
        words = text.split()
        if len(words) > self.wrap_words:
            n = self.wrap_words
            text = "&nbsp<br>&nbsp".join(
                " ".join(words[i : i + n]) for i in range(0, len(words), n)
            )
        if edge.conditional:
            return f" -. &nbsp;{text}&nbsp; .-> "
        return f" -- &nbsp;{text}&nbsp; --> "


def _safe_id(name: str) -> str:
    """Spell ``name`` as a Mermaid id: other characters than [A-Za-z0-9_-] become ``\\<hex>``."""
    return "".join(ch if ch in _SAFE_ID_CHARS else f"\\{ord(ch):x}" for ch in name)


def _metadata_lines(metadata: Mapping[str, object]) -> list[str]:
    """Format ``key = value`` lines for scalar values and lists of scalars; skip the rest."""
    lines = []
    for key, value in metadata.items():
        shown = _metadata_value(value)
        if shown is not None:
            line = f"{key} = {shown}"
            for char, entity in _LABEL_ESCAPES:
                line = line.replace(char, entity)
            lines.append(line)
    return lines


def _metadata_value(value: object) -> str | None:
    scalars = (str, int, float, bool)
    if isinstance(value, scalars):
        return str(value)
    if isinstance(value, list | tuple | set) and all(isinstance(v, scalars) for v in value):
        items = [str(v) for v in value]
        return ", ".join(sorted(items) if isinstance(value, set) else items)
    return None
