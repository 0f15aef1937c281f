"""State schemas become channels; callables declare input schemas, destinations and injections."""

from __future__ import annotations

import dataclasses
import operator
from typing import Annotated, Any, ClassVar, Literal, NotRequired, TypedDict

import pytest

from bulksync.channels.binop import BinaryOperatorAggregate
from bulksync.channels.ephemeral_value import EphemeralValue
from bulksync.channels.last_value import LastValue
from bulksync.channels.topic import Topic
from bulksync.context import NullResume, Scratchpad, TaskContext, task_context
from bulksync.errors import InvalidGraphError
from bulksync.graph.schema import (
    ROOT,
    SchemaCoercer,
    channel_for,
    command_destinations,
    declared_input_schema,
    injecting_call,
    is_async_callable,
    is_pydantic_model,
    may_return_command,
    schema_channels,
    schema_mapper,
)
from bulksync.types import Command

pytest.importorskip("pydantic")
import pydantic  # only once the skip above has passed


def keep_last(current: list[int], update: list[int]) -> list[int]:
    """A reducer that ignores the current value."""
    return update


class TypedState(TypedDict):
    """A TypedDict state with a plain key, a reducer key and an optional key."""

    plain: str
    items: Annotated[list[int], operator.add]
    maybe: NotRequired[Annotated[list[int], keep_last]]


@dataclasses.dataclass
class DataState:
    """A dataclass state."""

    plain: str = ""
    items: Annotated[list[int], operator.add] = dataclasses.field(default_factory=list)
    shared: ClassVar[int] = 0


class ModelState(pydantic.BaseModel):
    """A pydantic state."""

    plain: str = ""
    items: Annotated[list[int], operator.add] = pydantic.Field(default_factory=list)


@pytest.mark.parametrize("schema", [TypedState, DataState, ModelState])
def test_keys_become_channels_in_declaration_order(schema: Any) -> None:
    channels = schema_channels(schema)
    assert list(channels)[:2] == ["plain", "items"]
    assert isinstance(channels["plain"], LastValue)
    assert isinstance(channels["items"], BinaryOperatorAggregate)
    assert channels["items"].operator is operator.add
    assert {name: ch.key for name, ch in channels.items()} == {name: name for name in channels}


def test_class_vars_are_not_state_keys() -> None:
    assert "shared" not in schema_channels(DataState)


def test_not_required_wrapper_keeps_the_reducer() -> None:
    channel = schema_channels(TypedState)["maybe"]
    assert isinstance(channel, BinaryOperatorAggregate)
    assert channel.operator is keep_last


def test_reducer_channel_starts_from_the_empty_value_of_the_type() -> None:
    assert schema_channels(TypedState)["items"].get() == []


def test_a_channel_given_in_annotated_is_used_as_is() -> None:
    topic: Topic[int] = Topic(int, accumulate=True)
    channel = channel_for("events", Annotated[list[int], topic])
    assert channel is topic
    assert channel.key == "events"


def test_a_channel_class_in_annotated_is_built_for_the_type() -> None:
    channel = channel_for("flag", Annotated[bool, EphemeralValue])
    assert isinstance(channel, EphemeralValue)
    assert channel.typ is bool


def test_a_schema_without_keys_is_one_root_value() -> None:
    channels = schema_channels(Annotated[list[int], operator.add])
    assert list(channels) == [ROOT]
    assert isinstance(channels[ROOT], BinaryOperatorAggregate)


def test_reducer_must_take_two_arguments() -> None:
    def one(value: int) -> int:
        return value

    with pytest.raises(InvalidGraphError, match=r"key 'bad'.*Expected \(a, b\) -> c"):
        channel_for("bad", Annotated[int, one])


def test_reserved_state_keys_are_rejected() -> None:
    bad = TypedDict("bad", {"__pregel_tasks": int})  # a dunder key: no class syntax

    with pytest.raises(InvalidGraphError, match=r"'__pregel_tasks'.*reserved"):
        schema_channels(bad)


def test_mappers_coerce_dataclass_and_pydantic_input_only() -> None:
    assert schema_mapper(TypedState) is None
    assert schema_mapper(dict) is None
    data = schema_mapper(DataState)
    model = schema_mapper(ModelState)
    assert isinstance(data, SchemaCoercer)
    assert isinstance(model, SchemaCoercer)
    assert data({"plain": "p", "items": [1]}) == DataState("p", [1])
    assert model({"plain": "p"}) == ModelState(plain="p")


def test_pydantic_detection() -> None:
    assert is_pydantic_model(ModelState)
    assert not is_pydantic_model(DataState)
    assert not is_pydantic_model(ModelState())


def _context(config: dict[str, Any], chunks: list[Any]) -> TaskContext:
    pad = Scratchpad(task_ns="n:1", step=1, stop=5, resume=[], null_resume=NullResume())
    return TaskContext(config=config, scratchpad=pad, stream_writer=chunks.append, send=print)


def test_injecting_call_passes_config_and_writer_when_declared() -> None:
    def node(state: dict[str, Any], config: dict[str, Any], *, writer: Any) -> Any:
        writer("chunk")
        return (state, config["tag"])

    chunks: list[Any] = []
    call = injecting_call(node)
    assert (call.config, call.writer) == (True, True)
    with task_context(_context({"tag": "t"}, chunks)):
        assert call({"a": 1}) == ({"a": 1}, "t")
    assert chunks == ["chunk"]


def test_injecting_call_passes_only_the_input_otherwise() -> None:
    def node(state: int, *args: Any) -> int:
        return state + len(args)

    call = injecting_call(node)
    assert (call.config, call.writer) == (False, False)
    assert call(1) == 1
    assert injecting_call(len)([1, 2]) == 2


def test_async_functions_and_async_call_objects_are_async() -> None:
    async def coroutine(state: int) -> int:
        return state

    class AsyncObject:
        async def __call__(self, state: int) -> int:
            return state

    class SyncObject:
        def __call__(self, state: int) -> int:
            return state

    assert is_async_callable(coroutine)
    assert is_async_callable(AsyncObject())
    assert not is_async_callable(SyncObject())
    assert not is_async_callable(len)


def test_declared_input_schema_is_a_typed_first_parameter() -> None:
    def typed(state: TypedState) -> dict[str, Any]:
        return {}

    def plain(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    class Method:
        def __call__(self, state: DataState) -> None:
            return None

    assert declared_input_schema(typed) is TypedState
    assert declared_input_schema(plain) is None
    assert declared_input_schema(Method()) is DataState
    assert declared_input_schema(lambda state: state) is None


def test_command_literal_return_declares_destinations() -> None:
    assert command_destinations(Command[Literal["a", "b"]]) == ("a", "b")
    assert command_destinations(Command[Literal["a"]] | None) == ("a",)
    assert command_destinations(Command) is None
    assert command_destinations(dict[str, Any]) is None
    assert may_return_command(Command)
    assert may_return_command(Command[str] | dict[str, Any])
    assert may_return_command(Any) and may_return_command(None)
    assert not may_return_command(dict)
    assert not may_return_command(type(None))
