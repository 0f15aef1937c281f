"""A value kept for the length of a run but never written to a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, ValueChannel
from bulksync.errors import InvalidUpdateError

Value = TypeVar("Value")


class UntrackedValue(ValueChannel[Value, Value]):
    """Holds the last value written, in memory only: ``checkpoint()`` is always ``MISSING``.

    With ``guard`` (the default) two writes in one step fail; without it the last one wins.
    A step without a write keeps the value.
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

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new, empty channel; ``checkpoint`` is ignored (the value is never stored)."""
        return self.blank()

    def copy(self) -> Self:
        """A copy that keeps the value.

        The base ``copy`` goes through ``checkpoint()``, which never carries this value; reads
        of a step's state on a copy of the channels (edges, branches) must still see it.
        """
        new = self.blank()
        new.value = self.value
        return new

    def checkpoint(self) -> Any:
        """Always ``MISSING``: the value is never stored."""
        return MISSING

    def update(self, values: Sequence[Value]) -> bool:
        """Keep the step's value; no write leaves the old value in place.

        Raises:
            InvalidUpdateError: when ``guard`` is set and the step wrote more than one value.
        """
        if not values:
            return False
        if self.guard and len(values) > 1:
            raise InvalidUpdateError(
                f"At key '{self.key}': UntrackedValue(guard=True) can receive only one value "
                "per step. Write it from one node per step, or use guard=False to keep the last."
            )
        self.value = values[-1]
        return True
