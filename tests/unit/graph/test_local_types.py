"""Classes defined inside a function, in a graph's state: found from the schemas, stored,
decoded.

No ``from __future__ import annotations`` here: the annotations of classes defined in a
function must be real objects, as they are in the programs this is for (string annotations
naming a function's locals cannot be resolved by anyone, LangGraph included).
"""

import dataclasses
import enum
import operator
from typing import Annotated, Any, NamedTuple, Optional, TypedDict

import pydantic

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.graph import START, StateGraph
from bulksync.graph.schema import stored_types


def test_stored_types_are_found_through_annotations_to_any_depth() -> None:
    class Colour(enum.Enum):
        RED = "red"

    class Pair(NamedTuple):
        a: int
        b: int

    class Point(pydantic.BaseModel):
        x: int
        colour: Colour = Colour.RED

    @dataclasses.dataclass
    class Box:
        corner: Point
        pairs: list[Pair]

    class State(TypedDict):
        boxes: Annotated[list[Box], operator.add]
        last: Optional[Point]  # noqa: UP045 -- the spelling real programs use
        count: int

    assert stored_types([State]) == {Box, Point, Pair, Colour}


def test_a_state_model_defined_in_a_function_round_trips_through_a_saver() -> None:
    class Point(pydantic.BaseModel):
        x: int

    @dataclasses.dataclass
    class Box:
        corner: Point

    class State(TypedDict):
        boxes: Annotated[list[Box], operator.add]

    def add(state: State) -> dict[str, Any]:
        return {"boxes": [Box(Point(x=len(state["boxes"])))]}

    graph = StateGraph(State).add_node("add", add).add_edge(START, "add")
    compiled = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    compiled.invoke({"boxes": []}, config)
    out = compiled.invoke({"boxes": []}, config)  # reads the stored boxes back
    assert out == {"boxes": [Box(Point(x=0)), Box(Point(x=1))]}
