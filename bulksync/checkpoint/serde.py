"""msgpack serialization with an explicit registry of extension types.

Two layers, each turning the one above into bytes:

1. **values → bytes** — ``MsgpackSerde.dumps``/``loads``: channel values and pending writes.
   msgpack's own types (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``,
   ``dict`` with any hashable keys) pass through; everything else must be listed below.
2. **records → bytes/text** — ``dumps_checkpoint``/``loads_checkpoint`` (a checkpoint without
   its channel values, which savers store apart as blobs) and ``dumps_metadata``/
   ``loads_metadata`` (JSON text, so every saver matches ``list(filter=...)`` alike).

Extension codes; each payload is itself msgpack, so values nest::

     1 tuple        [items]               20 Enum member   ["mod:Qual", value]
     2 set          [items]               21 dataclass     ["mod:Qual", {field: value}]
     3 frozenset    [items]               22 Pydantic v2   ["mod:Qual", {field: value},
     4 datetime     [iso, zone, fold]                       extra | None, [fields set]]
     5 date         iso                   23 NamedTuple    ["mod:Qual", [items]]
     6 time         [iso, zone, fold]     30 Send          [node, arg, timeout?]
     7 timedelta    [days, secs, us]      31 Interrupt     [value, id, schema?]
     8 UUID         16 bytes              32 Command       [graph, update, resume, goto]
     9 Decimal      str                   33 Overwrite     value
    10 (unused)                           40 exception     [type name, str, repr]
    11 int > 64 bit decimal str           41 langchain_core message  [class name, {field: value}]
    12 deque        [items, maxlen]
    13 complex      [real, imag]
    14 Fraction     [numerator, denominator]

A Send's ``timeout`` is ``[run_timeout, idle_timeout, refresh_on]`` (when it has one).
``zone`` is the IANA key of a ``zoneinfo.ZoneInfo`` (else ``None``: the ISO text keeps the
offset). Subclasses of ``str``, ``int``, ``float``, ``list`` and ``dict`` that are none of the
above are stored as their base type, and ``bytearray``/``memoryview`` as ``bytes`` (msgpack
packs them itself, before any hook can see them). Exceptions decode to ``StoredError``.

Safety: nothing is pickled, and decoding never imports a module because the data names it.
User types (codes 20-23) are named ``module:qualname`` and resolved only from the explicit
registry (``register_type``, ``MsgpackSerde.register``) or from modules already imported, and
only if the name really is a class of the stored kind. Messages (41) are looked up among the
classes ``langchain_core.messages`` exports, and only when langchain_core is installed.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import importlib
import importlib.util
import json
import sys
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import msgpack

from bulksync.checkpoint.base import Checkpoint, Serde
from bulksync.errors import SerializationError, StoredError, describe_type
from bulksync.types import Command, Interrupt, Overwrite, Send, TimeoutPolicy

C = TypeVar("C", bound=type)

# Extension codes (table in the module docstring). They are stored: never renumber or reuse.
EXT_TUPLE, EXT_SET, EXT_FROZENSET = 1, 2, 3
EXT_DATETIME, EXT_DATE, EXT_TIME, EXT_TIMEDELTA = 4, 5, 6, 7
EXT_UUID, EXT_DECIMAL, EXT_BIGINT = 8, 9, 11
EXT_DEQUE, EXT_COMPLEX, EXT_FRACTION = 12, 13, 14
EXT_ENUM, EXT_DATACLASS, EXT_PYDANTIC, EXT_NAMEDTUPLE = 20, 21, 22, 23
EXT_SEND, EXT_INTERRUPT, EXT_COMMAND, EXT_OVERWRITE = 30, 31, 32, 33
EXT_EXCEPTION, EXT_LC_MESSAGE = 40, 41

_KIND_BY_CODE = {
    EXT_ENUM: "Enum",
    EXT_DATACLASS: "dataclass",
    EXT_PYDANTIC: "Pydantic model",
    EXT_NAMEDTUPLE: "NamedTuple",
}
_LC_MESSAGES = "langchain_core.messages"

_registry: dict[str, type] = {}


def type_ref(cls: type) -> str:
    """The ``module:qualname`` a user type is stored under."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _pydantic_base() -> type | None:
    # Never imported here: a model instance can only exist if its process loaded pydantic.
    module = sys.modules.get("pydantic")
    base = getattr(module, "BaseModel", None)
    return base if isinstance(base, type) else None


def _is_kind(obj: object, code: int) -> bool:
    if not isinstance(obj, type):
        return False
    if code == EXT_ENUM:
        return issubclass(obj, enum.Enum)
    if code == EXT_DATACLASS:
        return dataclasses.is_dataclass(obj)
    if code == EXT_NAMEDTUPLE:
        return issubclass(obj, tuple) and hasattr(obj, "_fields")
    base = _pydantic_base()
    return base is not None and issubclass(obj, base)


def _kind_code(cls: type) -> int | None:
    for code in (EXT_ENUM, EXT_DATACLASS, EXT_NAMEDTUPLE, EXT_PYDANTIC):
        if _is_kind(cls, code):
            return code
    return None


def _register(into: dict[str, type], cls: C) -> C:
    if _kind_code(cls) is None:
        raise SerializationError(
            f"Cannot register '{cls!r}': only dataclasses, Enums, NamedTuples and Pydantic v2 "
            "models are stored by name; other types need converting to supported values."
        )
    into[type_ref(cls)] = cls
    return cls


def register_type(cls: C) -> C:
    """Allow every ``MsgpackSerde`` to decode ``cls`` by name; usable as a class decorator."""
    return _register(_registry, cls)


def lookup_loaded(ref: str) -> object | None:
    """The object ``module:qualname`` names in a module already imported (never imports)."""
    module_name, _, qualname = ref.partition(":")
    obj: object | None = sys.modules.get(module_name)
    for part in qualname.split("."):
        if obj is None or part.startswith("<"):
            return None
        obj = getattr(obj, part, None)
    return obj


def _not_encodable(value: Any, bad: object) -> SerializationError:
    path = find_value_path(value, bad) or "the value"
    return SerializationError(
        f"Cannot store {path}: type '{describe_type(bad)}' has no msgpack encoding. Convert it "
        "to str, int, float, bool, None, bytes, list, dict, tuple, set, datetime, UUID, Decimal "
        "or an Enum, or make it a dataclass or a Pydantic v2 model."
    )


def find_value_path(value: Any, bad: object, path: str = "value", depth: int = 0) -> str | None:
    """Where ``bad`` sits inside ``value`` (``value['k'][0].field``), for error messages."""
    if value is bad:
        return path
    if depth > 64:
        return None
    children: Iterable[tuple[str, Any]] = ()
    if isinstance(value, Mapping):
        keys = ((f"{path} (a key)", k) for k in value)
        children = [*keys, *((f"{path}[{k!r}]", v) for k, v in value.items())]
    elif isinstance(value, (list, tuple, collections.deque)):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, (set, frozenset)):
        children = ((f"{path} (an element)", v) for v in value)
    elif isinstance(value, Send):
        children = [(f"{path}.arg", value.arg)]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = ((f"{path}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(getattr(type(value), "model_fields", None), Mapping):
        children = ((f"{path}.{k}", getattr(value, k, None)) for k in type(value).model_fields)
    for child_path, child in children:
        found = find_value_path(child, bad, child_path, depth + 1)
        if found is not None:
            return found
    return None


def _zone_of(value: datetime.datetime | datetime.time) -> str | None:
    tz = value.tzinfo
    return tz.key if isinstance(tz, zoneinfo.ZoneInfo) else None


def _load_datetime(payload: list[Any]) -> datetime.datetime:
    iso, zone, fold = payload
    value = datetime.datetime.fromisoformat(iso)
    tz = zoneinfo.ZoneInfo(zone) if zone else value.tzinfo
    return value.replace(tzinfo=tz, fold=fold)


def _load_time(payload: list[Any]) -> datetime.time:
    iso, zone, fold = payload
    value = datetime.time.fromisoformat(iso)
    tz = zoneinfo.ZoneInfo(zone) if zone else value.tzinfo
    return value.replace(tzinfo=tz, fold=fold)


def _dataclass_fields(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def _model_fields(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in type(value).model_fields}


def pack_timeout(policy: TimeoutPolicy | None) -> list[Any]:
    """A timeout as the optional last field of a record (a Send, a task descriptor): none
    without one, else ``[run_timeout, idle_timeout, refresh_on]``."""
    if policy is None:
        return []
    return [[policy.run_timeout, policy.idle_timeout, policy.refresh_on]]


def unpack_timeout(rest: Sequence[Any]) -> TimeoutPolicy | None:
    """The timeout ``pack_timeout`` wrote, from the record's fields after the fixed ones."""
    return TimeoutPolicy(*rest[0]) if rest else None


# Exact types only: subclasses (IntEnum, bool, NamedTuple, ...) are matched after, by kind.
_ENCODERS: dict[type, Callable[[Any], tuple[int, Any]]] = {
    tuple: lambda v: (EXT_TUPLE, list(v)),
    set: lambda v: (EXT_SET, list(v)),
    frozenset: lambda v: (EXT_FROZENSET, list(v)),
    datetime.datetime: lambda v: (EXT_DATETIME, [v.isoformat(), _zone_of(v), v.fold]),
    datetime.date: lambda v: (EXT_DATE, v.isoformat()),
    datetime.time: lambda v: (EXT_TIME, [v.isoformat(), _zone_of(v), v.fold]),
    datetime.timedelta: lambda v: (EXT_TIMEDELTA, [v.days, v.seconds, v.microseconds]),
    uuid.UUID: lambda v: (EXT_UUID, v.bytes),
    decimal.Decimal: lambda v: (EXT_DECIMAL, str(v)),
    int: lambda v: (EXT_BIGINT, str(v)),
    collections.deque: lambda v: (EXT_DEQUE, [list(v), v.maxlen]),
    complex: lambda v: (EXT_COMPLEX, [v.real, v.imag]),
    fractions.Fraction: lambda v: (EXT_FRACTION, [v.numerator, v.denominator]),
    Send: lambda v: (EXT_SEND, [v.node, v.arg, *pack_timeout(v.timeout)]),
    Interrupt: lambda v: (
        EXT_INTERRUPT,
        [v.value, v.id] if v.response_schema is None else [v.value, v.id, v.response_schema],
    ),
    Command: lambda v: (EXT_COMMAND, [v.graph, v.update, v.resume, v.goto]),
    Overwrite: lambda v: (EXT_OVERWRITE, v.value),
    StoredError: lambda v: (EXT_EXCEPTION, [v.type_name, v.message, v.original_repr]),
}

_DECODERS: dict[int, Callable[[Any], Any]] = {
    EXT_TUPLE: tuple,
    EXT_SET: set,
    EXT_FROZENSET: frozenset,
    EXT_DATETIME: _load_datetime,
    EXT_DATE: datetime.date.fromisoformat,
    EXT_TIME: _load_time,
    EXT_TIMEDELTA: lambda p: datetime.timedelta(days=p[0], seconds=p[1], microseconds=p[2]),
    EXT_UUID: lambda p: uuid.UUID(bytes=p),
    EXT_DECIMAL: decimal.Decimal,
    EXT_BIGINT: int,
    EXT_DEQUE: lambda p: collections.deque(p[0], p[1]),
    EXT_COMPLEX: lambda p: complex(p[0], p[1]),
    EXT_FRACTION: lambda p: fractions.Fraction(p[0], p[1]),
    EXT_SEND: lambda p: Send(p[0], p[1], timeout=unpack_timeout(p[2:])),
    EXT_INTERRUPT: lambda p: Interrupt(p[0], p[1], p[2] if len(p) > 2 else None),
    EXT_COMMAND: lambda p: Command(graph=p[0], update=p[1], resume=p[2], goto=p[3]),
    EXT_OVERWRITE: Overwrite,
    EXT_EXCEPTION: lambda p: StoredError(p[0], p[1], p[2]),
}

_BASE_TYPES: tuple[type[Any], ...] = (str, int, float, list, dict)


class _Unencodable(Exception):
    """Raised inside msgpack's ``default`` hook; ``dumps`` turns it into a SerializationError."""

    def __init__(self, bad: object) -> None:
        super().__init__()
        self.bad = bad


class MsgpackSerde:
    """The ``Serde`` of every saver: msgpack plus the extension types in the module docstring."""

    format: ClassVar[str] = "bulksync-msgpack"
    """Every instance writes the same bytes (registries only matter when decoding), so an
    ``Encoded`` made by one is stored as is by a saver using another."""

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._types: dict[str, type] = {}
        for cls in types:
            self.register(cls)

    def register(self, cls: C) -> C:
        """Allow this serde to decode ``cls`` by name; usable as a class decorator."""
        return _register(self._types, cls)

    def dumps(self, value: Any) -> bytes:
        """Encode ``value``; raises SerializationError naming the type and where it sits."""
        try:
            return self._pack(value)
        except _Unencodable as exc:
            raise _not_encodable(value, exc.bad) from None
        except (ValueError, OverflowError, RecursionError) as exc:
            raise SerializationError(
                f"Cannot store the value: {exc}. Values must be finite trees (no reference "
                "cycles) of supported types."
            ) from exc

    def loads(self, data: bytes) -> Any:
        """Decode bytes made by ``dumps``; raises SerializationError for unknown stored types."""
        return self._unpack(data)

    def _pack(self, value: Any) -> bytes:
        data: bytes = msgpack.packb(
            value, default=self._default, use_bin_type=True, strict_types=True, datetime=False
        )
        return data

    def _unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(
            data, ext_hook=self._ext_hook, raw=False, strict_map_key=False, use_list=True
        )

    def _default(self, value: Any) -> Any:
        encoder = _ENCODERS.get(type(value))
        if encoder is not None:
            code, payload = encoder(value)
        else:
            code, payload = self._encode_by_kind(value)
            if code < 0:
                return payload
        return msgpack.ExtType(code, self._pack(payload))

    def _encode_by_kind(self, value: Any) -> tuple[int, Any]:
        """``(code, payload)``, or ``(-1, plain value)`` for a subclass of a msgpack type."""
        cls = type(value)
        if isinstance(value, enum.Enum):
            return EXT_ENUM, [type_ref(cls), value.value]
        if isinstance(value, BaseException):
            return EXT_EXCEPTION, [describe_type(value), str(value), repr(value)]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return EXT_DATACLASS, [type_ref(cls), _dataclass_fields(value)]
        if isinstance(value, tuple) and hasattr(cls, "_fields"):
            return EXT_NAMEDTUPLE, [type_ref(cls), list(value)]
        lc_base = getattr(sys.modules.get(f"{_LC_MESSAGES}.base"), "BaseMessage", None)
        if isinstance(lc_base, type) and isinstance(value, lc_base):
            lc_module = sys.modules.get(_LC_MESSAGES)
            if getattr(lc_module, cls.__name__, None) is cls:
                return EXT_LC_MESSAGE, [cls.__name__, _model_fields(value)]
        pydantic_base = _pydantic_base()
        if pydantic_base is not None and isinstance(value, pydantic_base):
            model: Any = value
            extra, fields_set = model.model_extra, sorted(model.model_fields_set)
            return EXT_PYDANTIC, [type_ref(cls), _model_fields(model), extra, fields_set]
        for base in _BASE_TYPES:
            if isinstance(value, base):
                return -1, base(value)
        raise _Unencodable(value)

    def _ext_hook(self, code: int, data: bytes) -> Any:
        payload = self._unpack(data)
        decoder = _DECODERS.get(code)
        if decoder is not None:
            return decoder(payload)
        if code in _KIND_BY_CODE:
            return self._decode_user_type(code, payload)
        if code == EXT_LC_MESSAGE:
            return _decode_message(payload[0], payload[1])
        raise SerializationError(
            f"Cannot decode msgpack extension code {code}: it was written by a newer or "
            "different serializer. Read it with the bulksync version that wrote it."
        )

    def _decode_user_type(self, code: int, payload: list[Any]) -> Any:
        cls: Any = self._resolve(payload[0], code)
        try:
            if code == EXT_ENUM:
                return cls(payload[1])
            if code == EXT_NAMEDTUPLE:
                return cls(*payload[1])
            if code == EXT_PYDANTIC:
                values = {**payload[1], **(payload[2] or {})}
                return cls.model_construct(_fields_set=set(payload[3]), **values)
            return _build_dataclass(cls, payload[1])
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"Cannot rebuild a stored '{payload[0]}': {exc}. The class no longer matches "
                "the stored value (renamed fields or members?); keep old names readable."
            ) from exc

    def _resolve(self, ref: str, code: int) -> type:
        kind = _KIND_BY_CODE[code]
        cls = self._types.get(ref) or _registry.get(ref)
        found = cls if cls is not None else lookup_loaded(ref)
        if isinstance(found, type) and _is_kind(found, code):
            return found
        module = ref.partition(":")[0]
        why = (
            f"module '{module}' is not imported in this process (bulksync never imports "
            "modules named by stored data)"
            if module not in sys.modules
            else f"'{ref}' names no {kind} loaded in this process"
        )
        raise SerializationError(
            f"Cannot decode a stored {kind} of type '{ref}': {why}. Import the module that "
            "defines it before loading, or register the class with "
            "bulksync.checkpoint.serde.register_type(cls) or MsgpackSerde(types=[cls])."
        )


def _build_dataclass(cls: type, values: dict[str, Any]) -> Any:
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    obj = cls(**{k: v for k, v in values.items() if k in init})
    for name, value in values.items():
        if name not in init:
            # Fields excluded from __init__ are restored as stored (works for frozen classes).
            object.__setattr__(obj, name, value)
    return obj


def _decode_message(name: str, fields: dict[str, Any]) -> Any:
    if importlib.util.find_spec("langchain_core") is None:
        raise SerializationError(
            f"Cannot decode a stored langchain_core message '{name}': langchain_core is not "
            "installed. Install langchain-core to read this thread."
        )
    module = importlib.import_module(_LC_MESSAGES)
    cls = getattr(module, name, None) if name in getattr(module, "__all__", ()) else None
    if not (isinstance(cls, type) and issubclass(cls, module.BaseMessage)):
        raise SerializationError(
            f"Cannot decode a stored langchain_core message '{name}': "
            f"{_LC_MESSAGES} exports no message class of that name in this version."
        )
    return cls(**fields)


def dumps_for(serde: Serde, value: Any, *, node: str, channel: str) -> bytes:
    """``serde.dumps(value)``, with the node and channel named in any SerializationError."""
    try:
        return serde.dumps(value)
    except SerializationError as exc:
        raise SerializationError(f"node '{node}', channel '{channel}': {exc}") from exc


def dumps_checkpoint(serde: Serde, checkpoint: Checkpoint) -> bytes:
    """Encode ``checkpoint`` without its channel values (savers store those as blobs)."""
    return serde.dumps(
        {
            "v": checkpoint.v,
            "id": checkpoint.id,
            "ts": checkpoint.ts,
            "channel_versions": dict(checkpoint.channel_versions),
            "versions_seen": {k: dict(v) for k, v in checkpoint.versions_seen.items()},
            "updated_channels": checkpoint.updated_channels,
        }
    )


def loads_checkpoint(serde: Serde, data: bytes) -> Checkpoint:
    """Rebuild a checkpoint from ``dumps_checkpoint`` bytes, with no channel values yet.

    Savers add the values with ``dataclasses.replace(checkpoint, channel_values=...)``.
    """
    record = serde.loads(data)
    updated = record["updated_channels"]
    return Checkpoint(
        v=record["v"],
        id=record["id"],
        ts=record["ts"],
        channel_values={},
        channel_versions=record["channel_versions"],
        versions_seen=record["versions_seen"],
        updated_channels=None if updated is None else tuple(updated),
    )


def dumps_metadata(metadata: Mapping[str, Any]) -> str:
    """Checkpoint metadata as JSON text; its values must be JSON (lists come back as lists).

    Encoded once (every commit stores metadata); only a value JSON refuses is looked for
    key by key, to name it.
    """
    for key in metadata:
        if not isinstance(key, str):
            raise SerializationError(
                f"Cannot store checkpoint metadata key {key!r}: metadata keys must be str."
            )
    try:
        return json.dumps(
            dict(metadata), separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError):
        _name_refused_value(metadata)
        raise


def _name_refused_value(metadata: Mapping[str, Any]) -> None:
    """Raise ``SerializationError`` naming the first key of ``metadata`` whose value JSON
    refuses (a date, NaN, an object)."""
    for key, value in metadata.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"Cannot store checkpoint metadata key '{key}': {exc}. Metadata holds only "
                "str, int, float, bool, None and lists/dicts of them; convert the value first."
            ) from exc


def loads_metadata(text: str) -> dict[str, Any]:
    """Read metadata written by ``dumps_metadata``."""
    value: dict[str, Any] = json.loads(text)
    return value
