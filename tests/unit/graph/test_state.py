"""StateGraph: building, validating and compiling into a GraphSpec, and drawing."""

from __future__ import annotations

import asyncio
import dataclasses
import operator
from typing import Annotated, Any, Literal, TypedDict

import pytest

from bulksync.channels.binop import BinaryOperatorAggregate
from bulksync.channels.ephemeral_value import EphemeralValue
from bulksync.channels.last_value import LastValue, LastValueAfterFinish
from bulksync.channels.named_barrier_value import NamedBarrierValue, NamedBarrierValueAfterFinish
from bulksync.channels.topic import Topic
from bulksync.constants import END, START, TASKS
from bulksync.errors import InvalidGraphError, InvalidUpdateError
from bulksync.graph.drawing import DrawEdge
from bulksync.graph.layout import builder_drawable
from bulksync.graph.schema import SchemaCoercer
from bulksync.graph.state import StateGraph, build_spec
from bulksync.types import Command, RetryPolicy, Send


class State(TypedDict):
    """Two keys: one plain, one with a reducer."""

    x: int
    log: Annotated[list[str], operator.add]


class Private(TypedDict):
    """A node-private input schema adding a key."""

    x: int
    scratch: str


@dataclasses.dataclass
class DataState:
    """A dataclass state."""

    x: int = 0


def nothing(state: Any) -> dict[str, Any]:
    """A node that updates nothing."""
    return {}


def replace(current: list[str], update: list[str]) -> list[str]:
    """A reducer other than ``operator.add``."""
    return update


def chain(*names: str, schema: Any = State) -> StateGraph[Any]:
    """START -> names[0] -> ... -> names[-1]."""
    builder = StateGraph(schema)
    builder.add_sequence([(name, nothing) for name in names])
    builder.add_edge(START, names[0])
    return builder


# -- compiled channels and nodes ---------------------------------------------------------


def test_spec_channels_in_langgraph_order_with_their_types() -> None:
    builder = chain("a", "b")
    builder.add_node("c", nothing, defer=True)
    builder.add_edge(["a", "b"], "c")
    spec = build_spec(builder)
    assert list(spec.channels) == [
        "x",
        "log",
        START,
        TASKS,
        "branch:to:a",
        "branch:to:b",
        "branch:to:c",
        "join:a+b:c",
    ]
    kinds = {name: type(ch) for name, ch in spec.channels.items()}
    assert kinds["x"] is LastValue and kinds["log"] is BinaryOperatorAggregate
    assert kinds[START] is EphemeralValue and kinds["branch:to:a"] is EphemeralValue
    assert kinds["branch:to:c"] is LastValueAfterFinish
    assert kinds["join:a+b:c"] is NamedBarrierValueAfterFinish
    tasks = spec.channels[TASKS]
    assert isinstance(tasks, Topic) and tasks.typ is Send and not tasks.accumulate
    trigger = spec.channels["branch:to:a"]
    assert isinstance(trigger, EphemeralValue) and not trigger.guard
    assert all(ch.key == name for name, ch in spec.channels.items())


def test_waiting_edge_to_plain_node_is_a_named_barrier() -> None:
    builder = chain("a", "b")
    builder.add_node("c", nothing)
    builder.add_edge(["b", "a"], "c")
    barrier = build_spec(builder).channels["join:b+a:c"]
    assert isinstance(barrier, NamedBarrierValue)
    assert barrier.names == frozenset({"a", "b"})


def test_triggers_and_trigger_to_nodes() -> None:
    builder = chain("a", "b")
    builder.add_node("c", nothing)
    builder.add_edge(["a", "b"], "c")
    spec = build_spec(builder)
    assert spec.nodes["c"].triggers == ("branch:to:c", "join:a+b:c")
    assert spec.trigger_to_nodes == {
        START: (START,),
        "branch:to:a": ("a",),
        "branch:to:b": ("b",),
        "branch:to:c": ("c",),
        "join:a+b:c": ("c",),
    }


def test_start_node_is_hidden_and_passes_the_input_through() -> None:
    start = build_spec(chain("a")).nodes[START]
    assert (start.triggers, start.channels, start.tags) == ((START,), START, ("langsmith:hidden",))
    assert start.run is not None and start.run({"x": 1}) == {"x": 1}


def test_node_spec_carries_options_and_reads_its_schema() -> None:
    policy = RetryPolicy(max_attempts=5)
    builder = StateGraph(State)
    builder.add_node("a", nothing, metadata={"k": "v"}, retry_policy=policy, queue="gpu")
    builder.add_node("b", nothing, retry_policy=[policy, RetryPolicy()], input_schema=Private)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    spec = build_spec(builder)
    a, b = spec.nodes["a"], spec.nodes["b"]
    assert (a.metadata, a.retry_policy, a.queue, a.tags) == ({"k": "v"}, (policy,), "gpu", ())
    assert b.retry_policy == (policy, RetryPolicy())
    assert a.channels == ("x", "log") and b.channels == ("x", "scratch")
    assert a.mapper is None and not a.is_async


def test_node_input_schema_is_inferred_from_the_first_parameter() -> None:
    def reader(state: Private) -> dict[str, Any]:
        return {"scratch": state["scratch"]}

    builder = StateGraph(State)
    builder.add_node(reader)
    builder.add_edge(START, "reader")
    spec = build_spec(builder)
    assert spec.nodes["reader"].channels == ("x", "scratch")
    assert "scratch" in spec.channels


def test_io_schemas_add_keys_and_set_outputs() -> None:
    class In(TypedDict):
        x: int
        question: str

    class Out(TypedDict):
        answer: str

    builder = StateGraph(State, input_schema=In, output_schema=Out)
    builder.add_node("a", nothing)
    builder.add_edge(START, "a")
    spec = build_spec(builder)
    assert spec.output_channels == ("answer",)
    assert spec.stream_channels == spec.state_keys == ("x", "log", "question", "answer")
    assert spec.nodes["a"].channels == ("x", "log")
    assert spec.input_channels == START and isinstance(spec.channels[START], EphemeralValue)


def test_dataclass_nodes_get_a_mapper() -> None:
    spec = build_spec(chain("a", schema=DataState))
    mapper = spec.nodes["a"].mapper
    assert isinstance(mapper, SchemaCoercer) and mapper({"x": 3}) == DataState(3)


def test_root_state_reads_and_returns_one_value() -> None:
    spec = build_spec(chain("a", schema=Annotated[list[int], operator.add]))
    assert spec.output_channels == spec.stream_channels == "__root__"
    assert spec.nodes["a"].channels == "__root__" and spec.nodes["a"].mapper is None


def test_interrupts_and_name_pass_through() -> None:
    builder = chain("a", "b")
    spec = build_spec(builder, ["a"], "*", name="g")
    assert (spec.interrupt_before, spec.interrupt_after, spec.name) == (("a",), "*", "g")
    assert build_spec(builder).interrupt_before == ()


def test_compile_builds_the_compiled_graph() -> None:
    builder = chain("a")
    compiled = builder.compile(interrupt_before=["a"], name="mine", debug=True)
    assert compiled.builder is builder and compiled.name == "mine" and compiled.debug
    assert compiled.spec.interrupt_before == ("a",) and compiled.spec.name == "mine"
    assert builder.compile().name == "LangGraph"


# -- nodes -------------------------------------------------------------------------------


def test_node_names_are_inferred() -> None:
    class Greeter:
        def __call__(self, state: Any) -> dict[str, Any]:
            return {}

    def named(state: Any) -> dict[str, Any]:
        return {}

    builder = StateGraph(State)
    builder.add_node(named)
    builder.add_node(Greeter())
    builder.add_node(lambda s: {})
    assert list(builder.nodes) == ["named", "Greeter", "<lambda>"]


def test_node_run_injects_config_and_async_nodes_return_coroutines() -> None:
    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        return {"x": state["x"] + 1}

    builder = StateGraph(State)
    builder.add_node(slow)
    builder.add_edge(START, "slow")
    node = build_spec(builder).nodes["slow"]
    assert node.is_async and node.run is not None
    assert asyncio.run(node.run({"x": 1})) == {"x": 2}


def test_a_compiled_graph_is_a_subgraph_node() -> None:
    class Child(TypedDict):
        x: int
        private: str

    child = StateGraph(Child)
    child.add_node("inner", nothing)
    child.add_edge(START, "inner")
    sub = child.compile(name="kid")
    builder = StateGraph(State)
    builder.add_node(sub)
    builder.add_edge(START, "kid")
    node = build_spec(builder).nodes["kid"]
    assert node.subgraph is sub and node.run is None and not node.is_async
    # A subgraph returns its whole state; the parent keeps only its own keys, like LangGraph.
    assert node.writer({"x": 1, "private": "p"}, lambda s, w: {}) == [("x", 1)]


def test_command_literal_return_declares_destinations() -> None:
    def router(state: Any) -> Command[Literal["b", "__end__"]]:
        return Command(goto="b")

    builder = StateGraph(State)
    builder.add_node(router)
    builder.add_node("b", nothing)
    builder.add_edge(START, "router")
    assert builder.nodes["router"].ends == ("b", END)
    build_spec(builder)  # "b" is reachable through the declared destination


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (START, "`__start__` is reserved"),
        (END, "`__end__` is reserved"),
        (TASKS, "is reserved"),
        ("a|b", "'|' is a reserved character"),
        ("a:b", "':' is a reserved character"),
        ("a", "`a` already present"),
    ],
)
def test_bad_node_names_are_rejected(name: str, message: str) -> None:
    builder = chain("a")
    with pytest.raises(InvalidGraphError, match=message) as info:
        builder.add_node(name, nothing)
    assert isinstance(info.value, ValueError)


def test_add_node_needs_an_action() -> None:
    with pytest.raises(InvalidGraphError, match="add_node\\('a'\\)"):
        StateGraph(State).add_node("a")


def test_schemas_declaring_a_key_differently_clash() -> None:
    class Other(TypedDict):
        log: Annotated[list[str], replace]

    class Plain(TypedDict):
        log: list[str]

    StateGraph(State).add_node("ok", nothing, input_schema=Plain)
    with pytest.raises(InvalidGraphError, match="Channel 'log' already exists"):
        StateGraph(State).add_node("a", nothing, input_schema=Other)


# -- edges -------------------------------------------------------------------------------


def test_add_edge_rejects_end_as_start_and_start_as_end() -> None:
    builder = chain("a")
    with pytest.raises(InvalidGraphError, match="END cannot be a start node"):
        builder.add_edge(END, "a")
    with pytest.raises(InvalidGraphError, match="START cannot be an end node"):
        builder.add_edge("a", START)
    with pytest.raises(InvalidGraphError, match="END cannot be a start node"):
        builder.add_edge(["a", END], "a")


def test_waiting_edges_need_known_nodes_and_a_start() -> None:
    builder = chain("a")
    with pytest.raises(InvalidGraphError, match="Need to add_node `ghost` first"):
        builder.add_edge(["a", "ghost"], END)
    with pytest.raises(InvalidGraphError, match="Need to add_node `ghost` first"):
        builder.add_edge(["a"], "ghost")
    with pytest.raises(InvalidGraphError, match="at least one start"):
        builder.add_edge([], "a")


def test_branch_names_must_be_unique_per_source() -> None:
    builder = chain("a", "b")
    builder.add_conditional_edges("a", lambda s: END)
    with pytest.raises(InvalidGraphError, match="`condition` already exists for node `a`"):
        builder.add_conditional_edges("a", lambda s: END)


def test_entry_finish_and_conditional_entry_helpers() -> None:
    builder = StateGraph(State)
    builder.add_sequence([("a", nothing), ("b", nothing)])
    builder.set_entry_point("a").set_finish_point("b")
    assert builder.edges == {(START, "a"), ("a", "b"), ("b", END)}
    other = StateGraph(State)
    other.add_node("a", nothing)
    other.set_conditional_entry_point(lambda s: "a", ["a"])
    spec = build_spec(other)
    assert spec.nodes[START].writer({"x": 1}, lambda s, w: {}) == [
        ("x", 1),
        ("branch:to:a", None),
    ]


def test_add_sequence_rejects_empty_and_repeated_names() -> None:
    with pytest.raises(InvalidGraphError, match="at least one node"):
        StateGraph(State).add_sequence([])
    with pytest.raises(InvalidGraphError, match="'nothing' already exists"):
        StateGraph(State).add_sequence([nothing, nothing])


# -- validation --------------------------------------------------------------------------


def test_no_entry_point() -> None:
    builder = StateGraph(State)
    builder.add_node("a", nothing)
    with pytest.raises(InvalidGraphError, match="must have an entrypoint"):
        builder.compile()


def test_edge_from_unknown_node() -> None:
    builder = chain("a")
    builder.add_edge("ghost", "a")
    with pytest.raises(InvalidGraphError, match=r"starting at unknown node 'ghost'.*add_node"):
        builder.validate()


def test_edge_to_unknown_node() -> None:
    builder = chain("a")
    builder.add_edge("a", "ghost")
    with pytest.raises(InvalidGraphError, match="ending at unknown node `ghost`"):
        build_spec(builder)


def test_branch_from_unknown_node() -> None:
    builder = chain("a")
    builder.add_conditional_edges("ghost", lambda s: "a", ["a"])
    with pytest.raises(InvalidGraphError, match="starting at unknown node 'ghost'"):
        build_spec(builder)


def test_path_map_naming_an_unknown_node() -> None:
    builder = chain("a")

    def pick(state: Any) -> str:
        return "go"

    builder.add_conditional_edges("a", pick, {"go": "ghost"})
    with pytest.raises(InvalidGraphError, match="At 'a' node, 'pick' branch found unknown target"):
        build_spec(builder)


def test_literal_path_naming_an_unknown_node() -> None:
    builder = chain("a")

    def pick(state: Any) -> Literal["ghost", "__end__"]:
        return "ghost"

    builder.add_conditional_edges("a", pick)
    assert builder.branches["a"]["pick"].ends == {"ghost": "ghost", END: END}
    with pytest.raises(InvalidGraphError, match="unknown target 'ghost'"):
        build_spec(builder)


def test_destinations_naming_an_unknown_node() -> None:
    builder = StateGraph(State)
    builder.add_node("a", nothing, destinations=("ghost",))
    builder.add_edge(START, "a")
    with pytest.raises(InvalidGraphError, match="ending at unknown node `ghost`"):
        build_spec(builder)


def test_interrupt_on_unknown_node() -> None:
    builder = chain("a")
    with pytest.raises(InvalidGraphError, match="Interrupt node `ghost` not found"):
        build_spec(builder, interrupt_after=["ghost"])
    with pytest.raises(InvalidGraphError, match="Interrupt node `ghost` not found"):
        builder.compile(interrupt_before=["ghost"], interrupt_after="*")


def test_interrupt_may_name_an_error_handler() -> None:
    """As in LangGraph, a breakpoint may name a handler: a node's own, or the default one."""
    builder = chain("a")
    builder.add_node("b", nothing, error_handler=nothing)
    builder.add_edge("a", "b")
    builder.compile(interrupt_before=["__error_handler__b"])
    with pytest.raises(InvalidGraphError, match="`__error_handler__a` not found"):
        builder.compile(interrupt_before=["__error_handler__a"])  # a has no handler
    with pytest.raises(InvalidGraphError, match="`__default_error_handler__` not found"):
        builder.compile(interrupt_before=["__default_error_handler__"])
    builder.set_node_defaults(error_handler=nothing)
    builder.compile(interrupt_before=["__error_handler__b", "__default_error_handler__"])


def test_unreachable_nodes_are_named() -> None:
    builder = chain("a")
    builder.add_node("island", nothing)
    builder.add_node("loop1", nothing)
    builder.add_node("loop2", nothing)
    builder.add_edge("loop1", "loop2")
    builder.add_edge("loop2", "loop1")
    build_spec(builder)  # LangGraph compiles it: unreachable nodes are only ever idle
    with pytest.raises(InvalidGraphError) as info:
        build_spec(builder, strict=True)
    message = str(info.value)
    assert "['island', 'loop1', 'loop2'] cannot be reached from START" in message
    assert "destinations=" in message


def test_join_and_path_map_targets_are_reachable() -> None:
    builder = chain("a")
    builder.add_node("b", nothing)
    builder.add_node("c", nothing)
    builder.add_conditional_edges("a", lambda s: "b", ["b"])
    builder.add_edge(["a", "b"], "c")
    build_spec(builder)


@pytest.mark.parametrize("router", ["branch", "command", "unannotated", "subgraph"])
def test_nodes_that_may_route_anywhere_make_every_node_reachable(router: str) -> None:
    def commander(state: Any) -> Command[Any]:
        return Command(goto="b")

    builder = StateGraph(State)
    if router == "subgraph":
        builder.add_node("a", chain("inner").compile())
    elif router == "unannotated":
        builder.add_node("a", lambda s: Command(goto="b"))
    else:
        builder.add_node("a", commander if router == "command" else nothing)
    builder.add_node("b", nothing)
    builder.add_edge(START, "a")
    if router == "branch":
        builder.add_conditional_edges("a", lambda s: "b")
    build_spec(builder)
    assert builder.compiled


def test_unknown_key_in_a_node_output_still_fails_after_compile_when_strict() -> None:
    spec = build_spec(chain("a"), strict=True)
    with pytest.raises(InvalidUpdateError, match="'y'"):
        spec.nodes["a"].writer({"y": 1}, lambda s, w: {})


# -- drawing -----------------------------------------------------------------------------


def test_drawable_edges_follow_langgraph() -> None:
    builder = chain("a", "b")
    builder.add_node("c", nothing, destinations={"b": "retry", END: "done"})
    builder.add_node("d", nothing, defer=True)

    def pick(state: Any) -> str:
        return "c"

    builder.add_conditional_edges("b", pick, {"again": "c", "stop": END})
    builder.add_edge(["a", "c"], "d")
    drawing = builder_drawable(builder, build_spec(builder, interrupt_before=["c"]))
    assert drawing.nodes == (START, "a", "b", "c", "d", END)
    assert set(drawing.edges) == {
        DrawEdge(START, "a"),
        DrawEdge("a", "b"),
        DrawEdge("a", "d"),
        DrawEdge("b", "c", True, "again"),
        DrawEdge("b", END, True, "stop"),
        # LangGraph draws this one too: "d" woke in a step where none of the writers of its
        # join ran, so every node of the step before gets a dotted edge to it.
        DrawEdge("b", "d", True, None),
        DrawEdge("c", "b", True, "retry"),
        DrawEdge("c", END, True, "done"),
        DrawEdge("c", "d"),
        DrawEdge("d", END),
    }
    assert drawing.metadata == {"c": {"__interrupt": "before"}, "d": {"defer": True}}


def test_a_branch_without_path_map_draws_no_edge() -> None:
    builder = chain("a")
    builder.add_node("b", nothing)
    builder.add_conditional_edges("a", lambda s: "b")
    drawing = builder_drawable(builder)
    assert set(drawing.edges) == {DrawEdge(START, "a"), DrawEdge("a", END)}


def _reference_graphs(lib: Any) -> list[Any]:
    """The same graphs built with LangGraph's or bulksync's StateGraph class ``lib``."""
    looped = lib(State)
    for name in "abc":
        looped.add_node(name, nothing)
    looped.add_edge(START, "a")
    looped.add_conditional_edges("a", lambda s: "x", {"x": "b", "y": "c", "z": END})
    looped.add_edge("b", "a")
    joined = lib(State)
    for name in "abcd":
        joined.add_node(name, nothing, defer=name == "d")
    joined.add_edge(START, "a")
    joined.add_edge(START, "b")
    joined.add_edge("b", "c")
    joined.add_edge(["a", "c"], "d")
    fanned = lib(State)
    fanned.add_node("w", nothing)
    fanned.add_node("fin", nothing)
    fanned.add_conditional_edges(START, lambda s: [], ["w"])
    fanned.add_edge("w", "fin")
    return [looped, joined, fanned]


def test_drawings_match_langgraph() -> None:
    langgraph = pytest.importorskip("langgraph.graph")
    theirs = [
        g.compile().get_graph().draw_mermaid() for g in _reference_graphs(langgraph.StateGraph)
    ]
    ours = [builder_drawable(g).draw_mermaid() for g in _reference_graphs(StateGraph)]
    assert ours == theirs


def test_langgraphs_renamed_arguments_still_work_with_its_warnings() -> None:
    from bulksync.types import RetryPolicy
    from bulksync.warnings import LangGraphDeprecatedSinceV05, LangGraphDeprecatedSinceV10

    class In(TypedDict):
        x: int

    with pytest.warns(LangGraphDeprecatedSinceV05, match="`input` is deprecated"):
        builder = StateGraph(State, input=In)
    assert builder.input_schema is In
    with pytest.warns(LangGraphDeprecatedSinceV05, match="`output` is deprecated"):
        assert StateGraph(State, output=In).output_schema is In
    with pytest.warns(LangGraphDeprecatedSinceV10, match="Please use `context_schema`"):
        assert StateGraph(State, config_schema=In).context_schema is In
    policy = RetryPolicy(max_attempts=2)
    with pytest.warns(LangGraphDeprecatedSinceV05, match="Please use `retry_policy`"):
        builder.add_node("a", nothing, retry=policy)
    assert builder.nodes["a"].retry_policy == (policy,)


def test_node_defaults_apply_where_a_node_sets_none() -> None:
    from bulksync.types import RetryPolicy, TimeoutPolicy

    class S(TypedDict):
        x: int

    own, default = RetryPolicy(max_attempts=5), RetryPolicy(max_attempts=2)

    def handler(state: S) -> dict[str, int]:
        return {"x": -1}

    async def same(state: S) -> S:
        return state

    builder = (
        StateGraph(S)
        .add_node("a", same, retry_policy=own)
        .add_node("b", same, error_handler=handler)
        .set_node_defaults(retry_policy=default, error_handler=handler, timeout=3.0)
        .add_edge(START, "a")
        .add_edge("a", "b")
    )
    nodes = builder.compile().spec.nodes
    assert nodes["a"].retry_policy == (own,) and nodes["b"].retry_policy == (default,)
    assert nodes["a"].timeout == nodes["b"].timeout == TimeoutPolicy(run_timeout=3.0)
    assert nodes["a"].error_handler is not None and nodes["b"].error_handler is not None
    assert nodes["a"].error_handler.name == "__default_error_handler__"
    assert nodes["b"].error_handler.name == "__error_handler__b"


def test_a_node_default_cache_policy_applies_where_a_node_sets_none() -> None:
    from bulksync.types import CachePolicy

    class S(TypedDict):
        x: int

    own, default = CachePolicy(ttl=5), CachePolicy(ttl=60)
    builder = (
        StateGraph(S)
        .set_node_defaults(cache_policy=default)
        .add_node("a", lambda s: s, cache_policy=own)
        .add_node("b", lambda s: s)
        .add_edge(START, "a")
        .add_edge("a", "b")
    )
    nodes = builder.compile().spec.nodes
    assert (nodes["a"].cache_policy, nodes["b"].cache_policy) == (own, default)
    assert nodes["a"].cache_ns[::2] == ("__pregel_ns_writes", "a")


def test_a_checkpointer_that_is_not_one_is_named() -> None:
    class S(TypedDict):
        x: int

    class NotASaver:
        pass

    builder = StateGraph(S).add_node("a", lambda s: s).add_edge(START, "a")
    with pytest.raises(TypeError, match=r"Invalid checkpointer provided.*NotASaver"):
        builder.compile(checkpointer=NotASaver())


def test_a_node_named_like_the_default_error_handler_is_refused() -> None:
    class S(TypedDict):
        x: int

    builder = StateGraph(S).add_node("__default_error_handler__", lambda s: s)
    builder.add_edge(START, "__default_error_handler__")
    builder.set_node_defaults(error_handler=lambda s: s)
    with pytest.raises(ValueError, match="already exists"):
        builder.compile()
