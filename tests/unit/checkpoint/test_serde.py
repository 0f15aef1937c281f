"""MsgpackSerde: every registered type round-trips, unknown types fail clearly, nothing is
imported or unpickled because stored data names it."""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import decimal
import enum
import fractions
import importlib.util
import pickle
import sys
import textwrap
import uuid
import zoneinfo
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import pydantic
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage

from bulksync.checkpoint import serde as serde_module
from bulksync.checkpoint.base import Checkpoint
from bulksync.checkpoint.serde import (
    MsgpackSerde,
    dumps_checkpoint,
    dumps_for,
    dumps_metadata,
    loads_checkpoint,
    loads_metadata,
    register_type,
)
from bulksync.coordinator.clock import checkpoint_id
from bulksync.errors import SerializationError, StoredError
from bulksync.types import Command, Interrupt, Overwrite, Send


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"


class Perm(enum.Flag):
    R = 1
    W = 2


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    name: str
    points: tuple[Point, ...]
    computed: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass
class Derived:
    base: int
    double: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.double = self.base * 2


class Pair(NamedTuple):
    left: Any
    right: Any


class Inner(pydantic.BaseModel):
    when: datetime.date
    tags: set[str] = set()


class Outer(pydantic.BaseModel, extra="allow"):
    inner: Inner
    items: list[tuple[int, str]] = []
    note: str = "default"


class Opaque:
    """A plain class: no registered encoding."""


NY = zoneinfo.ZoneInfo("America/New_York")

ROUND_TRIPS: dict[str, Any] = {
    "tuple": (1, "a", None),
    "empty tuple": (),
    "nested tuple": [(1, (2, 3)), {"k": (4,)}],
    "set": {1, 2, 3},
    "frozenset": frozenset({"a", "b"}),
    "datetime naive": datetime.datetime(2024, 5, 1, 12, 30, 15, 123456),
    "datetime utc": datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC),
    "datetime offset": datetime.datetime(
        2024, 5, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-3, minutes=-30))
    ),
    "datetime zoneinfo fold": datetime.datetime(2024, 11, 3, 1, 30, tzinfo=NY, fold=1),
    "date": datetime.date(1999, 12, 31),
    "time": datetime.time(23, 59, 1, 5),
    "time tz": datetime.time(8, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    "time zoneinfo": datetime.time(8, tzinfo=NY),
    "timedelta": datetime.timedelta(days=-2, seconds=5, microseconds=7),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "decimal": decimal.Decimal("-1.10"),
    "decimal infinity": decimal.Decimal("Infinity"),
    "bytes": b"\x00\xff",
    "big int": 2**100,
    "big negative int": -(2**90),
    "deque": collections.deque([1, (2,)], maxlen=5),
    "complex": complex(1.5, -2),
    "fraction": fractions.Fraction(3, 7),
    "enum": Color.BLUE,
    "int enum": Level.HIGH,
    "str enum": Mode.FAST,
    "flag": Perm.R | Perm.W,
    "dataclass": Point(1, 2),
    "frozen slots dataclass": Frozen("f", (Point(1), Point(2, 3))),
    "dataclass non-init field": Derived(4),
    "namedtuple": Pair((1, 2), Color.RED),
    "pydantic": Outer(
        inner=Inner(when=datetime.date(2020, 1, 2), tags={"x"}),
        items=[(1, "a")],
        extra=(1,),  # type: ignore[call-arg]
    ),
    "send": Send("worker", {"item": (1, 2)}),
    "interrupt": Interrupt(value={"ask": "name?"}, id="abc"),
    "command": Command(update={"k": (1,)}, goto=[Send("a", 1), "b"], resume={"id": 2}),
    "command parent": Command(graph=Command.PARENT, goto=("x", "y")),
    "overwrite": Overwrite([1, 2]),
    "non-str keys": {1: "int", (1, "t"): "tuple", Color.RED: "enum", frozenset({2}): "fs"},
    "uuid and date keys": {uuid.UUID(int=5): 1, datetime.date(2020, 1, 1): 2},
    "messages": [
        HumanMessage(content="hi", id="1"),
        AIMessage(content="", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}], id="2"),
        ToolMessage(content="42", tool_call_id="c1", id="3"),
        AIMessageChunk(content="par", id="4"),
    ],
    "everything nested": {
        "state": [Point(1, 2), {"when": datetime.date(2021, 1, 1), "ids": {uuid.UUID(int=1)}}],
        "sends": (Send("n", Pair(1, [Level.LOW])),),
    },
}


def assert_same(actual: Any, expected: Any) -> None:
    """Equal, and of exactly the same types all the way down (a tuple is not a list)."""
    assert type(actual) is type(expected), (actual, expected)
    assert actual == expected
    if isinstance(expected, dict):
        for (ak, av), (ek, ev) in zip(
            sorted(actual.items(), key=repr), sorted(expected.items(), key=repr), strict=True
        ):
            assert_same(ak, ek)
            assert_same(av, ev)
    elif isinstance(expected, (list, tuple, collections.deque)):
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    elif dataclasses.is_dataclass(expected):
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name))


@pytest.fixture
def serde() -> MsgpackSerde:
    return MsgpackSerde()


@pytest.mark.parametrize("value", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_round_trip_keeps_value_and_type(serde: MsgpackSerde, value: Any) -> None:
    assert_same(serde.loads(serde.dumps(value)), value)
    assert_same(serde.loads(serde.dumps({"wrapped": [value]})), {"wrapped": [value]})


def test_deque_keeps_maxlen_and_datetime_keeps_zone(serde: MsgpackSerde) -> None:
    out = serde.loads(serde.dumps([collections.deque([1], maxlen=3), ROUND_TRIPS["time zoneinfo"]]))
    assert out[0].maxlen == 3
    assert out[1].tzinfo is NY


def test_pydantic_model_keeps_fields_set_and_extras(serde: MsgpackSerde) -> None:
    model = Outer(inner=Inner(when=datetime.date(2020, 1, 2)), extra="x")  # type: ignore[call-arg]
    out = serde.loads(serde.dumps(model))
    assert out.model_fields_set == {"inner", "extra"}
    assert out.model_extra == {"extra": "x"}
    assert type(out.inner) is Inner


def test_dataclass_non_init_field_is_restored_as_stored(serde: MsgpackSerde) -> None:
    value = Derived(4)
    value.double = 99
    assert serde.loads(serde.dumps(value)).double == 99


def test_subclasses_of_plain_types_are_stored_as_the_base_type(serde: MsgpackSerde) -> None:
    class Name(str):
        pass

    value = collections.OrderedDict(a=collections.defaultdict(list, b=[Name("x")]))
    out = serde.loads(serde.dumps(value))
    assert_same(out, {"a": {"b": ["x"]}})


def test_bytearray_and_memoryview_read_back_as_bytes(serde: MsgpackSerde) -> None:
    value = [bytearray(b"ab"), memoryview(b"cd")]
    assert_same(serde.loads(serde.dumps(value)), [b"ab", b"cd"])


def test_exception_is_stored_as_a_record(serde: MsgpackSerde) -> None:
    out = serde.loads(serde.dumps({"error": ValueError("bad input", 3)}))["error"]
    assert isinstance(out, StoredError)
    assert out.type_name == "builtins.ValueError"
    assert out.message == str(ValueError("bad input", 3))
    assert repr(out) == repr(ValueError("bad input", 3))
    assert serde.loads(serde.dumps(out)) == out
    assert copy.deepcopy(out) == out


def test_unknown_type_names_the_type_its_place_and_the_fix(serde: MsgpackSerde) -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps({"items": [1, {"x": Opaque()}]})
    message = str(info.value)
    assert f"{__name__}.Opaque" in message
    assert "value['items'][1]['x']" in message
    assert "dataclass" in message


def test_unknown_type_inside_a_dataclass_is_located(serde: MsgpackSerde) -> None:
    with pytest.raises(SerializationError, match=r"value\[0\]\.y"):
        serde.dumps([Point(1, Opaque())])  # type: ignore[arg-type]


def test_reduce_is_never_used(serde: MsgpackSerde) -> None:
    class Picklable:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Picklable, ())

    with pytest.raises(SerializationError, match="Picklable"):
        serde.dumps(Picklable())


def test_no_pickle_on_any_path(serde: MsgpackSerde, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle used")

    for name in ("dumps", "loads", "dump", "load", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    assert serde.loads(serde.dumps(ROUND_TRIPS)).keys() == ROUND_TRIPS.keys()


def test_cycle_is_a_serialization_error(serde: MsgpackSerde) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SerializationError, match="cycles"):
        serde.dumps(loop)


def test_dumps_for_names_node_and_channel(serde: MsgpackSerde) -> None:
    with pytest.raises(SerializationError) as info:
        dumps_for(serde, Opaque(), node="agent", channel="messages")
    assert str(info.value).startswith("node 'agent', channel 'messages': ")
    assert "Opaque" in str(info.value)
    assert dumps_for(serde, (1,), node="a", channel="b") == serde.dumps((1,))


def _ext(code: int, payload: Any) -> bytes:
    data: bytes = msgpack.packb(msgpack.ExtType(code, msgpack.packb(payload, use_bin_type=True)))
    return data


def test_type_from_a_module_not_loaded_is_refused_and_not_imported(
    serde: MsgpackSerde, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "bulksync_unloaded_models"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            import dataclasses
            @dataclasses.dataclass
            class Thing:
                x: int
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = _ext(serde_module.EXT_DATACLASS, [f"{module}:Thing", {"x": 1}])
    with pytest.raises(SerializationError) as info:
        serde.loads(data)
    assert f"module '{module}' is not imported" in str(info.value)
    assert "register_type" in str(info.value)
    assert module not in sys.modules


@pytest.mark.parametrize(
    ("code", "ref"),
    [
        ("EXT_DATACLASS", "os:system"),
        ("EXT_DATACLASS", f"{__name__}:Opaque"),
        ("EXT_DATACLASS", f"{__name__}:Point.x"),
        ("EXT_ENUM", f"{__name__}:Point"),
        ("EXT_PYDANTIC", f"{__name__}:Point"),
        ("EXT_NAMEDTUPLE", "builtins:tuple"),
        ("EXT_DATACLASS", f"{__name__}:missing_name"),
    ],
)
def test_name_that_is_not_a_class_of_the_stored_kind_is_refused(
    serde: MsgpackSerde, code: str, ref: str
) -> None:
    with pytest.raises(SerializationError, match="names no"):
        serde.loads(_ext(getattr(serde_module, code), [ref, {}]))


@pytest.mark.parametrize(
    ("code", "payload"),
    [
        ("EXT_DATACLASS", [f"{__name__}:Point", {"z": 1}]),
        ("EXT_ENUM", [f"{__name__}:Color", "green"]),
    ],
)
def test_stored_value_that_no_longer_fits_its_class(
    serde: MsgpackSerde, code: str, payload: list[Any]
) -> None:
    with pytest.raises(SerializationError, match="Cannot rebuild a stored"):
        serde.loads(_ext(getattr(serde_module, code), payload))


def test_local_class_needs_registration() -> None:
    @dataclasses.dataclass
    class Local:
        v: int

    data = MsgpackSerde().dumps(Local(1))
    with pytest.raises(SerializationError, match="Local"):
        MsgpackSerde().loads(data)
    assert MsgpackSerde(types=[Local]).loads(data) == Local(1)
    registered = MsgpackSerde()
    assert registered.register(Local) is Local
    assert registered.loads(data) == Local(1)


def test_register_type_applies_to_every_serde() -> None:
    class LocalColor(enum.Enum):
        GREEN = 1

    data = MsgpackSerde().dumps(LocalColor.GREEN)
    with pytest.raises(SerializationError):
        MsgpackSerde().loads(data)
    register_type(LocalColor)
    assert MsgpackSerde().loads(data) is LocalColor.GREEN


def test_register_rejects_types_not_stored_by_name(serde: MsgpackSerde) -> None:
    with pytest.raises(SerializationError, match="only dataclasses"):
        serde.register(Opaque)


def test_unknown_extension_code_is_refused(serde: MsgpackSerde) -> None:
    with pytest.raises(SerializationError, match="extension code 99"):
        serde.loads(_ext(99, None))


def test_message_without_langchain_core_says_what_to_install(
    serde: MsgpackSerde, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = serde.dumps(HumanMessage(content="hi"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SerializationError, match="Install langchain-core"):
        serde.loads(data)


@pytest.mark.parametrize("name", ["convert_to_messages", "ToolCall", "os", "Opaque"])
def test_message_name_must_be_an_exported_message_class(serde: MsgpackSerde, name: str) -> None:
    with pytest.raises(SerializationError, match="no message class"):
        serde.loads(_ext(serde_module.EXT_LC_MESSAGE, [name, {"content": "x"}]))


class CustomMessage(HumanMessage):
    extra_field: int = 0


def test_user_message_subclass_is_stored_as_a_pydantic_model(serde: MsgpackSerde) -> None:
    out = serde.loads(serde.dumps(CustomMessage(content="x", extra_field=2)))
    assert type(out) is CustomMessage
    assert out.extra_field == 2


def test_checkpoint_record_round_trip(serde: MsgpackSerde) -> None:
    checkpoint = Checkpoint(
        v=4,
        id=checkpoint_id(3),
        ts="2024-01-01T00:00:00+00:00",
        channel_values={"a": 1},
        channel_versions={"a": 2, "b": 1},
        versions_seen={"node": {"a": 1}},
        updated_channels=("a",),
    )
    out = loads_checkpoint(serde, dumps_checkpoint(serde, checkpoint))
    assert out == dataclasses.replace(checkpoint, channel_values={})
    assert type(out.updated_channels) is tuple


def test_metadata_is_json() -> None:
    metadata = {"source": "loop", "step": 3, "parents": {"": "id"}, "flag": True, "x": None}
    assert loads_metadata(dumps_metadata(metadata)) == metadata
    with pytest.raises(SerializationError, match="metadata key 'when'"):
        dumps_metadata({"source": "loop", "when": datetime.date(2020, 1, 1)})
    with pytest.raises(SerializationError, match="metadata key 'score'"):
        dumps_metadata({"source": "loop", "score": [1.0, float("nan")]})
    with pytest.raises(SerializationError, match="keys must be str"):
        dumps_metadata({1: "x"})  # type: ignore[dict-item]
