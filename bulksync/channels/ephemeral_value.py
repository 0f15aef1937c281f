"""A value that lives for one step: the graph input and the ``branch:to:<node>`` triggers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, ValueChannel
from bulksync.errors import InvalidUpdateError

Value = TypeVar("Value")


class EphemeralValue(ValueChannel[Value, Value]):
    """Holds the value written in the step just before; a step without a write clears it.

    With ``guard`` (the default) two writes in one step fail; without it the last one wins.
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
