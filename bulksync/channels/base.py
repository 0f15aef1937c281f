"""The channel contract every state key and control channel implements.

A channel holds one piece of graph state between supersteps. In a step the engine:

1. calls ``update(values)`` once per channel with every value written to it in the step, in
   task-path order (an empty list on a step that wrote nothing to it);
2. calls ``consume()`` on channels a task was triggered by;
3. calls ``finish()`` on every channel when the run would otherwise end.

Each returns True when the channel's value changed, which bumps its version. A channel is
rebuilt from stored data with ``from_checkpoint(checkpoint())``; the stored value must be
serializable by ``bulksync.checkpoint.serde``. Instances made by the graph builder are
templates: the engine never mutates them, it calls ``from_checkpoint`` to get live copies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Final, Generic, Self, TypeVar

from bulksync.errors import EmptyChannelError, InvalidUpdateError

Value = TypeVar("Value")
Update = TypeVar("Update")


class _Missing:
    """The type of ``MISSING``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()
"""Stands for "no value" where ``None`` is a valid value."""


class BaseChannel(Generic[Value, Update], ABC):
    """A versioned slot of graph state with a rule for combining a step's writes."""

    __slots__ = ("key", "typ")

    def __init__(self, typ: Any, key: str = "") -> None:
        self.typ = typ
        self.key = key

    @abstractmethod
    def from_checkpoint(self, checkpoint: Any) -> BaseChannel[Value, Update]:
        """A new live channel holding ``checkpoint`` (``MISSING`` for an empty one)."""

    def copy(self) -> BaseChannel[Value, Update]:
        """An independent copy of this channel and its value."""
        return self.from_checkpoint(self.checkpoint())

    @abstractmethod
    def checkpoint(self) -> Any:
        """The value to store, or ``MISSING`` when the channel is empty."""

    @abstractmethod
    def get(self) -> Value:
        """The current value.

        Raises:
            EmptyChannelError: when the channel holds no value.
        """

    def is_available(self) -> bool:
        """Whether ``get`` would return a value."""
        try:
            self.get()
        except EmptyChannelError:
            return False
        return True

    @abstractmethod
    def update(self, values: Sequence[Update]) -> bool:
        """Apply one step's writes; True when the value changed.

        Raises:
            InvalidUpdateError: when the writes cannot be combined (e.g. two values for a
                key that keeps only one).
        """

    def consume(self) -> bool:
        """Mark the value as read by the task it triggered; True when that changed it."""
        return False

    def finish(self) -> bool:
        """Called when the run would end; True when that changed the value."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r})"


class ValueChannel(BaseChannel[Value, Update]):
    """A channel whose whole state is one value (``MISSING`` when empty).

    Subclasses say how a step's writes change ``value`` (``update``), which settings make
    two channels the same (``spec``) and how to make an empty one (``blank``).
    """

    __slots__ = ("value",)

    def __init__(self, typ: Any, key: str = "") -> None:
        super().__init__(typ, key)
        self.value: Any = MISSING

    def spec(self) -> tuple[Any, ...]:
        """The settings two channels of this class must share to be equal."""
        return ()

    def blank(self) -> Self:
        """A new, empty channel with this one's settings and key."""
        return type(self)(self.typ, self.key)

    def __eq__(self, other: object) -> bool:
        """Channels compare by class and settings, never by value (as LangGraph's do)."""
        return isinstance(other, type(self)) and other.spec() == self.spec()

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new channel with this one's settings and key, holding ``checkpoint``."""
        new = self.blank()
        new.value = checkpoint
        return new

    def checkpoint(self) -> Any:
        """The value held, or ``MISSING``."""
        return self.value

    def get(self) -> Value:
        """The value held."""
        if self.value is MISSING:
            raise EmptyChannelError()
        value: Value = self.value
        return value

    def is_available(self) -> bool:
        """Whether a value is held."""
        return self.value is not MISSING


class GuardedValueChannel(ValueChannel[Value, Value]):
    """A single-value channel that takes one write per step when ``guard`` is set (the
    default); without it the last write of a step wins.
    """

    __slots__ = ("guard",)

    def __init__(self, typ: Any, guard: bool = True, *, key: str = "") -> None:
        super().__init__(typ, key)
        self.guard = guard

    def spec(self) -> tuple[Any, ...]:
        """Channels with the same guard are the same."""
        return (self.guard,)

    def blank(self) -> Self:
        """A new, empty channel with this one's guard and key."""
        return type(self)(self.typ, self.guard, key=self.key)

    def step_value(self, values: Sequence[Value]) -> Value:
        """The value a step wrote (``values`` is not empty).

        Raises:
            InvalidUpdateError: when ``guard`` is set and the step wrote more than one value.
        """
        if self.guard and len(values) > 1:
            raise InvalidUpdateError(
                f"At key '{self.key}': {type(self).__name__}(guard=True) can receive only one "
                "value per step. Write it from one node per step, or use guard=False to keep "
                "the last."
            )
        return values[-1]


__all__ = ["MISSING", "BaseChannel", "EmptyChannelError", "GuardedValueChannel", "ValueChannel"]
