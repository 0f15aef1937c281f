"""A value that many writers may set at once, on the promise that they all write the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.errors import EmptyChannelError

Value = TypeVar("Value")


class AnyValue(BaseChannel[Value, Value]):
    """Holds the last value written in the latest step; a step without a write clears it.

    Several writes in one step are accepted (the last is kept) because they are assumed equal.
    """

    __slots__ = ("value",)

    def __init__(self, typ: Any, key: str = "") -> None:
        super().__init__(typ, key)
        self.value: Any = MISSING

    def __eq__(self, other: object) -> bool:
        """Equal to any other ``AnyValue``: channels compare by spec, never by value."""
        return isinstance(other, AnyValue)

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new ``AnyValue`` with this one's type and key, holding ``checkpoint``."""
        new = type(self)(self.typ, self.key)
        new.value = checkpoint
        return new

    def checkpoint(self) -> Any:
        """The value held, or ``MISSING``."""
        return self.value

    def get(self) -> Value:
        """The value written in the latest step."""
        if self.value is MISSING:
            raise EmptyChannelError()
        value: Value = self.value
        return value

    def is_available(self) -> bool:
        """Whether a value is held."""
        return self.value is not MISSING

    def update(self, values: Sequence[Value]) -> bool:
        """Keep the step's last value, or drop the held one when the step wrote nothing."""
        if not values:
            if self.value is MISSING:
                return False
            self.value = MISSING
            return True
        self.value = values[-1]
        return True
