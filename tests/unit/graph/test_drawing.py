"""DrawableGraph renders the same Mermaid text as LangGraph and langchain_core."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.constants import END, START
from bulksync.errors import InvalidGraphError
from bulksync.graph.drawing import DrawableGraph, DrawEdge, NodeStyles

lg_graph = pytest.importorskip("langgraph.graph")
lc_graph = pytest.importorskip("langchain_core.runnables.graph")


class State(TypedDict):
    """A one-key state for reference graphs built with LangGraph."""

    log: Annotated[list[str], operator.add]


def step(state: State) -> dict[str, Any]:
    """A node that does nothing worth drawing."""
    return {}


def pick_b(state: State) -> str:
    """A router; only its path_map matters to the drawing."""
    return "b"


def langgraph_mermaid(build: Callable[[Any], None], **compile_kwargs: Any) -> str:
    """Draw, with LangGraph, the StateGraph that ``build`` fills in."""
    builder = lg_graph.StateGraph(State)
    build(builder)
    return str(builder.compile(**compile_kwargs).get_graph().draw_mermaid())


def langchain_mermaid(graph: DrawableGraph, **kwargs: Any) -> str:
    """Draw the same nodes and edges with langchain_core's own Graph."""
    ref = lc_graph.Graph()
    for name in graph.nodes:
        ref.add_node(None, name, metadata=graph.metadata.get(name))
    for e in graph.edges:
        ref.add_edge(ref.nodes[e.source], ref.nodes[e.target], e.label, e.conditional)
    return str(ref.draw_mermaid(**kwargs))


# --- against LangGraph StateGraphs --------------------------------------------------------------


def build_linear(b: Any) -> None:
    for name in ("a", "b"):
        b.add_node(name, step)
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", END)


LINEAR = DrawableGraph(
    [START, "a", "b", END],
    [DrawEdge(START, "a"), DrawEdge("a", "b"), DrawEdge("b", END)],
)


def build_conditional(b: Any) -> None:
    for name in ("a", "b", "c"):
        b.add_node(name, step)
    b.add_edge(START, "a")
    b.add_conditional_edges("a", pick_b, {"go b": "b", "go c": "c", "stop": END})
    b.add_edge("b", END)
    b.add_edge("c", "a")


CONDITIONAL = DrawableGraph(
    [START, "a", "b", "c", END],
    [
        DrawEdge(START, "a"),
        DrawEdge("a", END, conditional=True, label="stop"),
        DrawEdge("a", "b", conditional=True, label="go b"),
        DrawEdge("a", "c", conditional=True, label="go c"),
        DrawEdge("c", "a"),
        # LangGraph draws plain edges into __end__ from dead ends, after the sorted ones.
        DrawEdge("b", END),
    ],
)


def build_waiting(b: Any) -> None:
    for name in ("left", "right", "join"):
        b.add_node(name, step)
    b.add_edge(START, "left")
    b.add_edge(START, "right")
    b.add_edge(["left", "right"], "join")
    b.add_edge("join", END)


WAITING = DrawableGraph(
    [START, "left", "right", "join", END],
    [
        DrawEdge(START, "left"),
        DrawEdge(START, "right"),
        DrawEdge("left", "join"),
        DrawEdge("right", "join"),
        DrawEdge("join", END),
    ],
)


@pytest.mark.parametrize(
    ("build", "drawn"),
    [(build_linear, LINEAR), (build_conditional, CONDITIONAL), (build_waiting, WAITING)],
    ids=["linear", "conditional-path-map", "waiting-edge"],
)
def test_hand_built_graph_draws_like_langgraph(
    build: Callable[[Any], None], drawn: DrawableGraph
) -> None:
    assert drawn.draw_mermaid() == langgraph_mermaid(build)


def test_header_nodes_and_styles_have_langgraph_shape() -> None:
    text = LINEAR.draw_mermaid()
    assert text.startswith("---\nconfig:\n  flowchart:\n    curve: linear\n---\ngraph TD;\n")
    assert "\t__start__([<p>__start__</p>]):::first\n" in text
    assert "\t__end__([<p>__end__</p>]):::last\n" in text
    assert "\ta(a)\n" in text
    assert text.endswith("\tclassDef last fill:#bfb6fc\n")


def test_conditional_edges_are_dotted_and_labelled() -> None:
    text = CONDITIONAL.draw_mermaid()
    assert "\ta -. &nbsp;go b&nbsp; .-> b;\n" in text
    assert "\tc --> a;\n" in text


def test_list_path_map_and_interrupt_metadata_like_langgraph() -> None:
    def build(b: Any) -> None:
        for name in ("a", "b", "c"):
            b.add_node(name, step)
        b.add_edge(START, "a")
        b.add_conditional_edges("a", pick_b, ["b", "c"])

    drawn = DrawableGraph(
        [START, "a", "b", "c", END],
        [
            DrawEdge(START, "a"),
            DrawEdge("a", "b", conditional=True),
            DrawEdge("a", "c", conditional=True),
            DrawEdge("b", END),
            DrawEdge("c", END),
        ],
        metadata={"b": {"__interrupt": "before"}},
    )
    assert drawn.draw_mermaid() == langgraph_mermaid(build, interrupt_before=["b"])


# --- assemble: LangGraph's layout rules ---------------------------------------------------------


def test_assemble_orders_dedupes_and_matches_langgraph() -> None:
    discovered = [
        DrawEdge("c", "a"),
        DrawEdge("a", "c", conditional=True, label="go c"),
        DrawEdge("b", END),
        DrawEdge("a", END, conditional=True, label="stop"),
        DrawEdge(START, "a"),
        DrawEdge("a", "b", conditional=True, label="go b"),
        DrawEdge("c", "a"),
    ]
    drawn = DrawableGraph.assemble(["a", "b", "c"], discovered)
    assert drawn == CONDITIONAL
    assert drawn.draw_mermaid() == langgraph_mermaid(build_conditional)


def test_assemble_adds_end_edges_from_dead_ends() -> None:
    drawn = DrawableGraph.assemble(
        [START, "a", "b", "c"],
        [DrawEdge(START, "a"), DrawEdge("a", "c", True, "c"), DrawEdge("a", "b", True, "b")],
    )
    # Labels equal to their target are dropped; b and c have no way out, so both end.
    assert drawn.nodes == (START, "a", "b", "c", END)
    assert drawn.edges[1:] == (
        DrawEdge("a", "b", conditional=True),
        DrawEdge("a", "c", conditional=True),
        DrawEdge("b", END),
        DrawEdge("c", END),
    )


def test_assemble_keeps_first_edge_per_node_pair() -> None:
    drawn = DrawableGraph.assemble(
        ["a"], [DrawEdge(START, "a"), DrawEdge("a", END, True, "y"), DrawEdge("a", END, True, "x")]
    )
    assert drawn.edges == (DrawEdge(START, "a"), DrawEdge("a", END, conditional=True, label="x"))


def test_assemble_ignores_plain_end_edges_like_langgraph() -> None:
    def build(b: Any) -> None:
        for name in ("a", "b", "c"):
            b.add_node(name, step)
        b.add_edge(START, "a")
        b.add_edge("a", "b")
        b.add_edge("b", END)
        b.add_edge("b", "c")
        b.add_edge("c", "a")

    edges = [DrawEdge(START, "a"), DrawEdge("a", "b"), DrawEdge("b", END), DrawEdge("b", "c")]
    edges.append(DrawEdge("c", "a"))
    # Every node has a way out, nothing branches to __end__: LangGraph's simulation ends with
    # "a" alone in its last step and draws a dotted edge from it.
    drawn = DrawableGraph.assemble(["a", "b", "c"], edges, last_step_nodes=["a"])
    assert drawn.edges[-1] == DrawEdge("a", END, conditional=True)
    assert drawn.draw_mermaid() == langgraph_mermaid(build)
    several = DrawableGraph.assemble(["a", "b", "c"], edges, last_step_nodes=["a", "c"])
    assert END not in several.nodes


# --- against langchain_core's renderer ----------------------------------------------------------

ODD = DrawableGraph(
    [START, "my node", "a.b", "*bold*", "_x_", "café", END],
    [
        DrawEdge(START, "my node"),
        DrawEdge("my node", "a.b", conditional=True, label="one two three four five six seven"),
        DrawEdge("my node", "*bold*", label=" ".join(f"w{i}" for i in range(23))),
        DrawEdge("a.b", "_x_", conditional=True, label=" ".join(f"w{i}" for i in range(10))),
        DrawEdge("*bold*", "café"),
        DrawEdge("_x_", END),
        DrawEdge("café", END),
        DrawEdge("café", "café"),
    ],
    metadata={
        "a.b": {"k": "v", "n": 3, "f": 1.5, "ok": True, "skip": {"nested": 1}},
        "_x_": {"tags": ["t1", "t2"], "set": {"z", "y"}, "esc": '[a](b){c}"<d>|#e'},
        "café": {},
    },
)

SUBGRAPHS = DrawableGraph(
    [START, "p:a", "p:b", "p:q:x", "p:q:y", "r:solo", "s:only", "t:loop", "u:a", END],
    [
        DrawEdge(START, "p:a"),
        DrawEdge("p:a", "p:b"),
        DrawEdge("p:b", "p:q:x", conditional=True, label="in"),
        DrawEdge("p:q:x", "p:q:y"),
        DrawEdge("p:q:y", "r:solo"),
        DrawEdge("r:solo", "t:loop"),
        DrawEdge("t:loop", "t:loop"),
        DrawEdge("t:loop", "u:a"),
        DrawEdge("u:a", END),
    ],
)

NO_SINGLE_ENDS = DrawableGraph(["a", "b", "c"], [DrawEdge("a", "b")])

# Edges whose shared prefix has a colon and no parent block are dropped by langchain_core too.
ORPHAN_NESTED = DrawableGraph(
    ["x:s:a", "x:s:b", "solo"], [DrawEdge("x:s:a", "x:s:b"), DrawEdge("solo", "solo")]
)


@pytest.mark.parametrize(
    "graph", [ODD, SUBGRAPHS, NO_SINGLE_ENDS, ORPHAN_NESTED, LINEAR], ids=lambda g: g.nodes[1]
)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"with_styles": False},
        {"wrap_label_n_words": 3},
        {"curve_style": "basis"},
        {"node_colors": {"default": "fill:#000", "first": "fill:#111", "last": "fill:#222"}},
    ],
    ids=["default", "no-styles", "wrap-3", "basis", "colors"],
)
def test_draws_like_langchain_core(graph: DrawableGraph, options: dict[str, Any]) -> None:
    ours = dict(options)
    theirs = dict(options)
    if "curve_style" in options:
        theirs["curve_style"] = lc_graph.CurveStyle(options["curve_style"])
    if "node_colors" in options:
        ours["node_colors"] = NodeStyles(**options["node_colors"])
        theirs["node_colors"] = lc_graph.NodeStyles(**options["node_colors"])
    assert graph.draw_mermaid(**ours) == langchain_mermaid(graph, **theirs)


def test_curve_style_enum_is_accepted() -> None:
    text = LINEAR.draw_mermaid(curve_style=lc_graph.CurveStyle.STEP_AFTER)
    assert "    curve: stepAfter\n" in text


def test_first_and_last_node_need_a_single_candidate() -> None:
    assert (LINEAR.first_node(), LINEAR.last_node()) == (START, END)
    assert (NO_SINGLE_ENDS.first_node(), NO_SINGLE_ENDS.last_node()) == (None, None)
    assert "\ta(a)\n" in NO_SINGLE_ENDS.draw_mermaid()


def test_duplicate_subgraph_names_fail_like_langchain_core() -> None:
    graph = DrawableGraph(
        ["x:s:a", "x:s:b", "x:b", "y:s:a", "y:s:b", "y:b"],
        [
            DrawEdge("x:s:a", "x:s:b"),
            DrawEdge("x:s:a", "x:b"),
            DrawEdge("y:s:a", "y:s:b"),
            DrawEdge("y:s:a", "y:b"),
        ],
    )
    with pytest.raises(ValueError, match="'s'"):
        graph.draw_mermaid()
    with pytest.raises(ValueError, match="duplicate subgraph"):
        langchain_mermaid(graph)


# --- the records themselves ---------------------------------------------------------------------


def test_records_are_inspectable_and_frozen() -> None:
    assert WAITING.nodes == (START, "left", "right", "join", END)
    assert WAITING.edges[2] == DrawEdge("left", "join", conditional=False, label=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        WAITING.edges[0].label = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("nodes", "edges", "metadata", "match"),
    [
        (["a"], [DrawEdge("a", "b")], None, "unknown node 'b'"),
        (["a", "a"], [], None, r"\['a'\] are listed more than once"),
        (["a"], [], {"z": {}}, "unknown node 'z'"),
    ],
)
def test_bad_drawings_name_the_culprit(
    nodes: list[str], edges: list[DrawEdge], metadata: dict[str, Any] | None, match: str
) -> None:
    with pytest.raises(InvalidGraphError, match=match):
        DrawableGraph(nodes, edges, metadata=metadata)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"curve_style": "wiggly"}, "curve_style 'wiggly'"), ({"wrap_label_n_words": 0}, ">= 1")],
)
def test_bad_draw_options_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LINEAR.draw_mermaid(**options)


# --- get_graph(): LangChain's Graph, and xray ----------------------------------------------------


def _nested(graph_module: Any) -> Any:
    """A graph with a subgraph node whose own subgraph node is a two-node chain."""
    inner = graph_module.StateGraph(State)
    inner.add_node("p", step)
    inner.add_node("q", step)
    inner.add_edge(START, "p")
    inner.add_edge("p", "q")
    middle = graph_module.StateGraph(State)
    middle.add_node("x", step)
    middle.add_node("y", inner.compile())
    middle.add_edge(START, "x")
    middle.add_edge("x", "y")
    outer = graph_module.StateGraph(State)
    outer.add_node("a", step)
    outer.add_node("b", step)
    outer.add_node("sub", middle.compile())
    outer.add_edge(START, "a")
    outer.add_conditional_edges("a", pick_b, ["b", "sub"])
    outer.add_edge("b", END)
    return outer.compile(interrupt_before=["b"])


def _shown(graph: Any) -> tuple[str, list[Any], list[Any]]:
    nodes = [(k, n.name, n.metadata) for k, n in graph.nodes.items()]
    edges = [(e.source, e.target, e.data, e.conditional) for e in graph.edges]
    return str(graph.draw_mermaid()), nodes, edges


@pytest.mark.parametrize("xray", [False, True, 1, 2], ids=repr)
def test_get_graph_is_langchains_graph_with_langgraphs_xray(xray: bool | int) -> None:
    from bulksync import graph as bs_graph

    ours = _nested(bs_graph).get_graph(xray=xray)
    assert isinstance(ours, lc_graph.Graph)
    assert _shown(ours) == _shown(_nested(lg_graph).get_graph(xray=xray))


def test_without_langchain_get_graph_is_bulksyncs_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    from bulksync import graph as bs_graph
    from bulksync.graph import compiled

    monkeypatch.setattr(compiled, "langchain_available", lambda: False)
    drawing = _nested(bs_graph).get_graph(xray=True)
    assert isinstance(drawing, DrawableGraph)
    assert drawing.draw_mermaid() == _nested(lg_graph).get_graph(xray=True).draw_mermaid()


def test_a_subgraph_without_one_first_and_last_node_stays_a_node() -> None:
    outer = DrawableGraph([START, "s", END], [DrawEdge(START, "s"), DrawEdge("s", END)])
    forked = DrawableGraph(
        [START, "l", "r"], [DrawEdge(START, "l", True), DrawEdge(START, "r", True)]
    )
    assert outer.with_subgraph("s", forked) is outer
    assert outer.with_subgraph("ghost", forked) is outer
