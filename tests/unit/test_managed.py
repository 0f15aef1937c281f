"""Managed values: computed from the step and the run's limit, never channels."""

import operator
from typing import Annotated, TypedDict

from bulksync.graph.schema import schema_channels, schema_managed
from bulksync.managed import IsLastStep, RemainingSteps, managed_values


class Agent(TypedDict):
    log: Annotated[list[str], operator.add]
    remaining: RemainingSteps
    last: IsLastStep


def test_managed_keys_are_no_channels() -> None:
    assert list(schema_channels(Agent)) == ["log"]
    assert schema_managed(Agent) == {"remaining": "remaining_steps", "last": "is_last_step"}


def test_values_count_down_to_the_last_step() -> None:
    kinds = schema_managed(Agent)
    assert managed_values(kinds, step=1, stop=6) == {"remaining": 5, "last": False}
    assert managed_values(kinds, step=5, stop=6) == {"remaining": 1, "last": True}
    assert managed_values({}, step=1, stop=6) == {}


def test_a_managed_key_is_recognised_under_required_and_not_required() -> None:
    from typing import NotRequired, Required, TypedDict

    from bulksync.graph import START, StateGraph
    from bulksync.managed import IsLastStep, RemainingSteps

    class S(TypedDict, total=False):
        left: NotRequired[RemainingSteps]
        last: Required[IsLastStep]
        seen: list[object]

    def look(state: S) -> dict[str, object]:
        return {"seen": [state["left"], state["last"]]}

    builder = StateGraph(S)
    assert builder.managed == {"left": "remaining_steps", "last": "is_last_step"}
    graph = builder.add_node("look", look).add_edge(START, "look").compile()
    assert graph.invoke({"seen": []}, {"recursion_limit": 5}) == {"seen": [4, False]}
