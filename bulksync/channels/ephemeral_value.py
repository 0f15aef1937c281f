"""A value that lives for one step: the graph input and the ``branch:to:<node>`` triggers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.errors import EmptyChannelError, InvalidUpdateError

Value = TypeVar("Value")


class EphemeralValue(BaseChannel[Value, Value]):
    """Holds the value written in the step just before; a step without a write clears it.

    With ``guard`` (the default) two writes in one step fail; without it the last one wins.
    """

    __slots__ = ("guard", "value")

    def __init__(self, typ: Any, guard: bool = True, *, key: str = "") -> None:
        super().__init__(typ, key)
        self.guard = guard
        self.value: Any = MISSING

    def __eq__(self, other: object) -> bool:
        """Equal to another ``EphemeralValue`` with the same guard: compared by spec."""
        return isinstance(other, EphemeralValue) and other.guard == self.guard

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new channel with this one's settings and key, holding ``checkpoint``."""
        new = type(self)(self.typ, self.guard, key=self.key)
        new.value = checkpoint
        return new

    def checkpoint(self) -> Any:
        """The value held, or ``MISSING``."""
        return self.value

    def get(self) -> Value:
        """The value written in the previous step."""
        if self.value is MISSING:
            raise EmptyChannelError()
        value: Value = self.value
        return value

    def is_available(self) -> bool:
        """Whether the previous step wrote a value."""
        return self.value is not MISSING

    def update(self, values: Sequence[Value]) -> bool:
        """Hold the step's value, or drop the held one when the step wrote nothing.

        Raises:
            InvalidUpdateError: when ``guard`` is set and the step wrote more than one value.
        """
        if not values:
            if self.value is MISSING:
                return False
            self.value = MISSING
            return True
        if self.guard and len(values) > 1:
            raise InvalidUpdateError(
                f"At key '{self.key}': EphemeralValue(guard=True) can receive only one value "
                "per step. Write it from one node per step, or use guard=False to keep the last."
            )
        self.value = values[-1]
        return True
