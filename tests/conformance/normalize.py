"""Turn an observation from either implementation into plain data that compares equal.

Ids differ between runs and between engines (checkpoint ids are time based, task ids hash them),
so every UUID-like string and every 32-hex interrupt id — wherever it sits: a value, a dict key,
a substring such as ``"node:<uuid>"`` — becomes a placeholder numbered in order of first
appearance. Equal ids stay equal, distinct ids stay distinct, and the shape is kept.

Library objects become tagged tuples or dicts: ``("Interrupt", value, id)``, ``("Send", node,
arg)``, ``("Command", …)``, ``("Overwrite", value)``, snapshots and tasks as dicts of their
fields, chat messages as ``("message", type, content, id, name)``, exceptions as
``("error", class name)``, anything else unknown as ``("object", class name)``. The stdlib base
classes of each error are collected on the side (`Normalized.errors`) so a test can check that
``except`` clauses written for LangGraph still catch bulksync's error.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass, field
from typing import Any

UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
HEX32_RE = re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{32}(?![0-9a-zA-Z])")

VOLATILE_KEYS = frozenset({"ts", "timestamp", "created_at"})
"""Dict keys whose values are wall-clock times: kept as a marker, never compared."""

SNAPSHOT_FIELDS = (
    "values",
    "next",
    "config",
    "metadata",
    "created_at",
    "parent_config",
    "tasks",
    "interrupts",
)
TASK_FIELDS = ("id", "name", "path", "error", "interrupts", "state", "result")


@dataclass(frozen=True)
class ErrorSeen:
    """An exception met while normalising: its class name and its stdlib ancestors."""

    name: str
    stdlib_bases: frozenset[str]


@dataclass
class Normalized:
    """A normalised observation plus the errors met on the way."""

    data: Any
    errors: list[ErrorSeen] = field(default_factory=list)


def normalize(observation: Any) -> Normalized:
    """Normalise `observation`, numbering ids from one fresh counter per kind."""
    walker = _Walker()
    data = walker.walk(observation)
    return Normalized(data, walker.errors)


def stdlib_bases(exc_type: type[BaseException]) -> frozenset[str]:
    """Names of the builtin exception classes `exc_type` derives from (itself included)."""
    return frozenset(
        c.__name__
        for c in exc_type.__mro__
        if c.__module__ == "builtins" and issubclass(c, BaseException)
    )


class _Walker:
    """One normalisation pass; holds the id → placeholder maps so numbering is shared."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.counts: dict[str, int] = {"uuid": 0, "hex": 0}
        self.errors: list[ErrorSeen] = []

    def placeholder(self, kind: str, raw: str) -> str:
        """The placeholder for `raw`, allocating the next number of `kind` if it is new."""
        key = raw.lower()
        if key not in self.ids:
            self.counts[kind] += 1
            self.ids[key] = f"<{kind}-{self.counts[kind]}>"
        return self.ids[key]

    def text(self, s: str) -> str:
        """Replace every id inside `s` by its placeholder."""
        s = UUID_RE.sub(lambda m: self.placeholder("uuid", m.group(0)), s)
        return HEX32_RE.sub(lambda m: self.placeholder("hex", m.group(0)), s)

    def walk(self, obj: Any) -> Any:
        """Normalise one value, recursively."""
        if obj is None or isinstance(obj, (bool, int, float)):
            return obj
        if isinstance(obj, enum.Enum):
            return self.walk(obj.value)
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, BaseException):
            return self.error(obj)
        if isinstance(obj, dict):
            return {self.walk(k): self.value_for(k, v) for k, v in obj.items()}
        tagged = self.library_object(obj)
        if tagged is not None:
            return tagged
        if isinstance(obj, list):
            return [self.walk(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self.walk(v) for v in obj)
        if isinstance(obj, (set, frozenset)):
            return ("set", sorted((self.walk(v) for v in obj), key=repr))
        if isinstance(obj, (bytes, bytearray)):
            return ("bytes", bytes(obj).hex())
        return self.user_object(obj)

    def value_for(self, key: Any, value: Any) -> Any:
        """Normalise a dict value, masking wall-clock times."""
        if key in VOLATILE_KEYS and value is not None:
            return "<volatile>"
        return self.walk(value)

    def error(self, exc: BaseException) -> tuple[str, str]:
        """An exception as ``("error", class name)``; its stdlib bases go to `errors`."""
        self.errors.append(ErrorSeen(type(exc).__name__, stdlib_bases(type(exc))))
        return ("error", type(exc).__name__)

    def library_object(self, obj: Any) -> Any:
        """Tagged plain data for LangGraph/bulksync objects, or None if `obj` is not one."""
        kind = type(obj).__name__
        if kind == "Interrupt" and hasattr(obj, "value") and hasattr(obj, "id"):
            return ("Interrupt", self.walk(obj.value), self.walk(obj.id))
        if kind == "Send" and hasattr(obj, "node") and hasattr(obj, "arg"):
            return ("Send", self.walk(obj.node), self.walk(obj.arg))
        if kind == "Command" and hasattr(obj, "goto"):
            parts = (obj.graph, obj.update, obj.resume, obj.goto)
            return ("Command", *(self.walk(p) for p in parts))
        if kind == "Overwrite" and hasattr(obj, "value"):
            return ("Overwrite", self.walk(obj.value))
        if kind == "StateSnapshot":
            return {
                "StateSnapshot": {f: self.value_for(f, getattr(obj, f)) for f in SNAPSHOT_FIELDS}
            }
        if kind == "PregelTask":
            return {"PregelTask": {f: self.walk(getattr(obj, f)) for f in TASK_FIELDS}}
        if _is_message(obj):
            fields = (obj.type, obj.content, obj.id, getattr(obj, "name", None))
            return ("message", *(self.walk(p) for p in fields))
        return None

    def user_object(self, obj: Any) -> Any:
        """A dataclass or pydantic model as ``(class name, fields)``; else ``("object", name)``."""
        name = type(obj).__qualname__
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return (name, self.walk(fields))
        dump = getattr(obj, "model_dump", None)
        if callable(dump):
            return (name, self.walk(dump()))
        # Anything else is named, not compared: a scenario should observe plain data, and a
        # flavour returning an unexpected kind of object then shows up in the diff.
        return ("object", name)


def _is_message(obj: Any) -> bool:
    """Whether `obj` looks like a chat message (LangChain's or bulksync's)."""
    return (
        hasattr(obj, "content")
        and isinstance(getattr(obj, "type", None), str)
        and hasattr(obj, "id")
    )
