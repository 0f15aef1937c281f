"""``stream``/``invoke`` with ``version="v2"``: typed parts, schema instances, GraphOutput."""

from __future__ import annotations

import dataclasses
import operator
from typing import Annotated, Any

import pydantic
import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.errors import ConfigError
from bulksync.graph import START, StateGraph
from bulksync.types import GraphOutput, interrupt
from bulksync.warnings import LangGraphDeprecatedSinceV11


class Model(pydantic.BaseModel):
    value: str
    items: Annotated[list[str], operator.add] = []


@dataclasses.dataclass
class Data:
    value: str
    items: Annotated[list[str], operator.add] = dataclasses.field(default_factory=list)


def _graph(schema: Any, **compile_kw: Any) -> Any:
    def node(state: Any) -> dict[str, Any]:
        return {"value": state.value + "!", "items": ["n"]}

    return StateGraph(schema).add_node("node", node).add_edge(START, "node").compile(**compile_kw)


@pytest.mark.parametrize("schema", [Model, Data], ids=["pydantic", "dataclass"])
def test_values_come_as_the_schemas_instances(schema: Any) -> None:
    out = _graph(schema).invoke({"value": "x", "items": []}, version="v2")
    assert isinstance(out, GraphOutput) and isinstance(out.value, schema)
    assert (out.value.value, out.value.items, out.interrupts) == ("x!", ["n"], ())
    parts = list(_graph(schema).stream({"value": "x"}, stream_mode="values", version="v2"))
    assert all(isinstance(p["data"], schema) for p in parts)


def test_updates_and_checkpoints_of_a_model_state() -> None:
    graph = _graph(Model, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    parts = list(
        graph.stream({"value": "x"}, config, stream_mode=["updates", "checkpoints"], version="v2")
    )
    updates = [p["data"] for p in parts if p["type"] == "updates"]
    assert updates == [{"node": {"value": "x!", "items": ["n"]}}]  # updates stay dicts
    checkpoints = [p["data"]["values"] for p in parts if p["type"] == "checkpoints"]
    # The first checkpoint (before __start__ ran) stays a dict: it lacks required keys.
    assert checkpoints[0] == {"items": []}
    assert checkpoints[1:] == [Model(value="x"), Model(value="x!", items=["n"])]


def test_graph_output_reads_like_the_v1_dict_with_a_warning() -> None:
    def ask(state: Model) -> dict[str, Any]:
        return {"value": interrupt("name?")}

    graph = StateGraph(Model).add_node("ask", ask).add_edge(START, "ask")
    out = graph.compile(checkpointer=InMemorySaver()).invoke(
        {"value": "x"}, {"configurable": {"thread_id": "t"}}, version="v2"
    )
    assert [i.value for i in out.interrupts] == ["name?"]
    with pytest.warns(LangGraphDeprecatedSinceV11, match="via `key in result` is deprecated"):
        assert "__interrupt__" in out
    with pytest.warns(LangGraphDeprecatedSinceV11, match=r"via `result\[key\]` is deprecated"):
        assert out["__interrupt__"] == out.interrupts
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        out["missing"]


def test_an_unknown_version_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="Unknown version 'v9'"):
        list(_graph(Model).stream({"value": "x"}, version="v9"))
    with pytest.raises(ConfigError, match="Unknown version 'v9'"):
        _graph(Model).invoke({"value": "x"}, version="v9")
