"""A node's output becomes writes in LangGraph's order: updates, gotos, edges, branches."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.constants import END, START, TASKS
from bulksync.coordinator.spec import NodeWriter, Write
from bulksync.errors import InvalidGraphError, InvalidUpdateError, ParentCommand
from bulksync.graph.branch import Branch
from bulksync.graph.state import StateGraph, build_spec
from bulksync.types import Command, Send

pytest.importorskip("pydantic")
import pydantic  # only once the skip above has passed


class State(TypedDict):
    """Two keys: one plain, one with a reducer."""

    x: int
    log: Annotated[list[str], operator.add]


@dataclasses.dataclass
class DataState:
    """A dataclass state."""

    x: int = 0
    log: Annotated[list[str], operator.add] = dataclasses.field(default_factory=list)


class ModelState(pydantic.BaseModel):
    """A pydantic state with a None default."""

    x: int = 0
    note: str | None = None


class FakeRead:
    """A ``ReadState`` over a fixed state: plain keys take the last write, calls are recorded."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.calls: list[tuple[Any, list[Write]]] = []

    def __call__(self, select: Sequence[str] | str, writes: Sequence[Write]) -> Any:
        self.calls.append((select, list(writes)))
        values = dict(self.state)
        values.update(dict(writes))
        if isinstance(select, str):
            return values.get(select)
        return {k: values[k] for k in select if k in values}


def nothing(state: Any) -> dict[str, Any]:
    """A node that updates nothing."""
    return {}


def remember(seen: list[Any], value: Any, answer: str) -> str:
    """Record ``value`` in ``seen`` and return ``answer`` (a spying path function body)."""
    seen.append(value)
    return answer


def graph(schema: Any = State, *names: str) -> StateGraph[Any]:
    """A graph over ``schema`` with no-op nodes ``names``, the first the entry point.

    The first node declares the others as destinations (which writes nothing), so that they
    count as reachable.
    """
    builder = StateGraph(schema)
    builder.add_node(names[0], nothing, destinations=names[1:])
    for name in names[1:]:
        builder.add_node(name, nothing)
    builder.add_edge(START, names[0])
    return builder


def writer(builder: StateGraph[Any], node: str, *, strict: bool = False) -> NodeWriter:
    """The compiled writer of ``node`` (``strict``: with bulksync's stricter checks)."""
    return build_spec(builder, strict=strict).nodes[node].writer


def test_dict_output_becomes_one_write_per_key_then_static_edges() -> None:
    builder = graph(State, "a", "b", "c")
    builder.add_edge("a", "b")
    builder.add_edge("a", "c")
    builder.add_edge("a", END)
    out = writer(builder, "a")({"x": 1, "log": ["a"]}, FakeRead({}))
    assert out == [("x", 1), ("log", ["a"]), ("branch:to:b", None), ("branch:to:c", None)]


def test_none_output_writes_only_the_edges() -> None:
    builder = graph(State, "a", "b")
    builder.add_edge("a", "b")
    assert writer(builder, "a")(None, FakeRead({})) == [("branch:to:b", None)]


def test_unknown_key_names_node_key_and_valid_keys_when_strict() -> None:
    builder = graph(State, "a")
    with pytest.raises(InvalidUpdateError) as info:
        writer(builder, "a", strict=True)({"x": 1, "typo": 2}, FakeRead({}))
    message = str(info.value)
    assert "node 'a'" in message and "'typo'" in message and "['log', 'x']" in message


def test_unknown_key_is_dropped_by_default() -> None:
    builder = graph(State, "a")
    assert writer(builder, "a")({"x": 1, "typo": 2}, FakeRead({})) == [("x", 1)]
    assert writer(builder, "a")(Command(update={"nope": 1}), FakeRead({})) == []


def test_non_update_output_is_rejected_naming_the_node() -> None:
    builder = graph(State, "a")
    with pytest.raises(InvalidUpdateError, match=r"node 'a'.*Expected dict, got 3"):
        writer(builder, "a")(3, FakeRead({}))
    with pytest.raises(InvalidUpdateError, match="Expected dict"):
        writer(builder, "a")([{"x": 1}], FakeRead({}))


def test_command_update_then_goto_name_and_send() -> None:
    builder = graph(State, "a", "b")
    builder.add_edge("a", "b")
    send = Send("b", {"x": 7})
    command = Command(update={"log": ["u"]}, goto=["b", send, END])
    out = writer(builder, "a")(command, FakeRead({}))
    assert out == [("log", ["u"]), ("branch:to:b", None), (TASKS, send), ("branch:to:b", None)]


def test_command_goto_a_single_send_or_name() -> None:
    builder = graph(State, "a", "b")
    send = Send("b", 1)
    assert writer(builder, "a")(Command(goto=send), FakeRead({})) == [(TASKS, send)]
    assert writer(builder, "a")(Command(goto="b"), FakeRead({})) == [("branch:to:b", None)]
    assert writer(builder, "a")(Command(goto=END), FakeRead({})) == []


def test_command_to_parent_bubbles_up_without_checking_keys() -> None:
    builder = graph(State, "a")
    command = Command(graph=Command.PARENT, update={"parent_only": 1}, goto="elsewhere")
    with pytest.raises(ParentCommand) as info:
        writer(builder, "a")([{"x": 1}, command], FakeRead({}))
    assert info.value.command is command


def test_list_of_commands_and_dicts_writes_updates_first_in_order() -> None:
    builder = graph(State, "a", "b")
    output = [
        Command(update={"x": 1}, goto="b"),
        {"x": 2},
        Command(update=[("log", ["p"]), ("log", ["q"])]),
    ]
    out = writer(builder, "a")(output, FakeRead({}))
    assert out == [("x", 1), ("x", 2), ("log", ["p"]), ("log", ["q"]), ("branch:to:b", None)]


def test_command_update_with_unknown_key_is_rejected_when_strict() -> None:
    builder = graph(State, "a")
    with pytest.raises(InvalidUpdateError, match="'nope'"):
        writer(builder, "a", strict=True)(Command(update={"nope": 1}), FakeRead({}))


def test_goto_and_send_to_unknown_nodes_name_source_and_target_when_strict() -> None:
    builder = graph(State, "a")
    for output in (Command(goto="ghost"), Command(goto=Send("ghost", 1)), Send("ghost", 1)):
        with pytest.raises(InvalidGraphError, match=r"node 'a'.*unknown node 'ghost'"):
            writer(builder, "a", strict=True)(output, FakeRead({}))
    for strict in (True, False):  # not a destination at all: an error either way
        with pytest.raises(InvalidGraphError, match="valid destination"):
            writer(builder, "a", strict=strict)(Command(goto=START), FakeRead({}))


def test_goto_and_send_to_unknown_nodes_are_skipped_by_default() -> None:
    builder = graph(State, "a", "b")
    command = Command(update={"x": 1}, goto=["ghost", Send("ghost", 1), "b"])
    assert writer(builder, "a")(command, FakeRead({})) == [("x", 1), ("branch:to:b", None)]
    assert writer(builder, "a")(Send("ghost", 1), FakeRead({})) == []


def test_send_to_end_is_an_invalid_update() -> None:
    builder = graph(State, "a")
    with pytest.raises(InvalidUpdateError, match="Cannot send a packet to the END node"):
        writer(builder, "a")(Command(goto=Send(END, 1)), FakeRead({}))


def test_a_returned_send_is_a_task() -> None:
    builder = graph(State, "a", "b")
    send = Send("b", 3)
    assert writer(builder, "a")(send, FakeRead({})) == [(TASKS, send)]
    with pytest.raises(InvalidUpdateError, match="Send inside a list"):
        writer(builder, "a")([Command(goto="b"), send], FakeRead({}))


def test_waiting_edge_writes_the_node_name_to_the_join_channel() -> None:
    builder = graph(State, "a", "b", "c")
    builder.add_edge(START, "b")
    builder.add_edge(["a", "b"], "c")
    assert writer(builder, "a")({}, FakeRead({})) == [("join:a+b:c", "a")]
    assert writer(builder, "b")({}, FakeRead({})) == [("join:a+b:c", "b")]


def test_branch_reads_state_with_the_node_writes_and_maps_through_dict() -> None:
    builder = graph(State, "a", "big", "small")
    builder.add_conditional_edges(
        "a", lambda s: "hi" if s["x"] > 3 else "lo", {"hi": "big", "lo": "small"}
    )
    read = FakeRead({"x": 1, "log": []})
    assert writer(builder, "a")({"x": 5}, read) == [("x", 5), ("branch:to:big", None)]
    assert read.calls == [(("x", "log"), [("x", 5)])]
    assert writer(builder, "a")({}, FakeRead({"x": 1})) == [("branch:to:small", None)]


def test_branch_with_list_path_map_may_pick_several_and_end() -> None:
    builder = graph(State, "a", "b", "c")
    builder.add_conditional_edges("a", lambda s: ["c", END, "b"], ["b", "c", END])
    assert writer(builder, "a")(None, FakeRead({})) == [
        ("branch:to:c", None),
        ("branch:to:b", None),
    ]


def test_branch_answer_missing_from_path_map_names_the_keys() -> None:
    builder = graph(State, "a", "b")
    builder.add_conditional_edges("a", lambda s: "zzz", {"go": "b"})
    # A KeyError, as LangGraph raises, but naming the node and the keys.
    with pytest.raises(KeyError, match=r"node 'a'.*'zzz'.*path_map \['go'\]"):
        writer(builder, "a")(None, FakeRead({}))


def test_branch_without_path_map_routes_by_name_and_rejects_unknown() -> None:
    builder = graph(State, "a", "b")

    def route(state: dict[str, Any]) -> str:
        return "b" if state.get("x") else "nowhere"

    builder.add_conditional_edges("a", route)
    assert writer(builder, "a")({"x": 1}, FakeRead({})) == [("x", 1), ("branch:to:b", None)]
    with pytest.raises(InvalidGraphError, match=r"node 'a'.*'route'.*unknown node 'nowhere'"):
        writer(builder, "a", strict=True)(None, FakeRead({}))
    assert writer(builder, "a")(None, FakeRead({})) == []  # skipped, as LangGraph does
    with pytest.raises(InvalidGraphError, match="valid destination: got None"):
        Branch.from_path(lambda s: None, None).route("a", {}, {"b"}, strict=False)


def test_branch_sends_become_tasks() -> None:
    builder = graph(State, "a", "w")
    builder.add_conditional_edges("a", lambda s: [Send("w", i) for i in range(3)], ["w"])
    out = writer(builder, "a")(None, FakeRead({}))
    assert out == [(TASKS, Send("w", 0)), (TASKS, Send("w", 1)), (TASKS, Send("w", 2))]
    builder.add_conditional_edges(START, lambda s: Send(END, 1))
    with pytest.raises(InvalidUpdateError, match="END"):
        writer(builder, START)({"x": 1}, FakeRead({}))


def test_edges_come_before_branches_which_run_in_order() -> None:
    builder = graph(State, "a", "b", "c")
    builder.add_edge("a", "c")

    def first(state: dict[str, Any]) -> str:
        return "b"

    def second(state: dict[str, Any]) -> list[str]:
        return ["c"]

    builder.add_conditional_edges("a", first)
    builder.add_conditional_edges("a", second)
    read = FakeRead({})
    out = writer(builder, "a")({"x": 1}, read)
    assert out == [("x", 1), ("branch:to:c", None), ("branch:to:b", None), ("branch:to:c", None)]
    # The second branch sees everything written before it, the first branch's writes included.
    assert read.calls[1][1] == out[:3]


def test_branch_sees_the_nodes_extra_output_keys_for_dict_states() -> None:
    builder = StateGraph(State, input_schema=State)
    builder.add_node("a", nothing, input_schema=TypedDict("Narrow", {"x": int}))  # type: ignore[operator]
    builder.add_node("b", nothing)
    builder.add_edge(START, "a")
    seen: list[Any] = []
    builder.add_conditional_edges("a", lambda s: remember(seen, s, "b"))
    writer(builder, "a")({"log": ["new"]}, FakeRead({"x": 1, "log": ["old"]}))
    assert seen == [{"log": ["new"], "x": 1}]


def test_async_path_is_awaited() -> None:
    builder = graph(State, "a", "b")

    async def route(state: dict[str, Any]) -> str:
        return "b"

    builder.add_conditional_edges("a", route)
    assert writer(builder, "a")(None, FakeRead({})) == [("branch:to:b", None)]


def test_branch_on_dataclass_state_gets_an_instance() -> None:
    builder = graph(DataState, "a", "b")
    seen: list[Any] = []
    builder.add_conditional_edges("a", lambda s: remember(seen, s, "b"))
    writer(builder, "a")({"x": 4}, FakeRead({"x": 0, "log": []}))
    assert seen == [DataState(x=4, log=[])]


def test_dataclass_output_updates_every_field() -> None:
    builder = graph(DataState, "a")
    assert writer(builder, "a")(DataState(x=2), FakeRead({})) == [("x", 2), ("log", [])]


def test_pydantic_output_skips_unset_none_defaults() -> None:
    builder = graph(ModelState, "a")
    write = writer(builder, "a")
    assert write(ModelState(x=3), FakeRead({})) == [("x", 3)]
    assert write(ModelState(note=None), FakeRead({})) == [("x", 0), ("note", None)]


def test_foreign_dataclass_output_with_unknown_field_is_rejected_when_strict() -> None:
    @dataclasses.dataclass
    class Other:
        x: int
        stray: int

    with pytest.raises(InvalidUpdateError, match="'stray'"):
        writer(graph(State, "a"), "a", strict=True)(Other(1, 2), FakeRead({}))
    assert writer(graph(State, "a"), "a")(Other(1, 2), FakeRead({})) == [("x", 1)]


def test_start_node_keeps_input_schema_keys_and_drops_others() -> None:
    class Input(TypedDict):
        x: int
        extra: str

    builder = StateGraph(State, input_schema=Input)
    builder.add_node("a", nothing)
    builder.add_edge(START, "a")
    out = writer(builder, START)({"x": 1, "extra": "e", "log": ["not input"]}, FakeRead({}))
    assert out == [("x", 1), ("extra", "e"), ("branch:to:a", None)]


def test_root_state_writes_the_whole_output() -> None:
    builder = graph(Annotated[list[int], operator.add], "a")
    write = writer(builder, "a")
    assert write([1, 2], FakeRead({})) == [("__root__", [1, 2])]
    assert write(Command(update=[3]), FakeRead({})) == [("__root__", [3])]
    assert write(None, FakeRead({})) == []
