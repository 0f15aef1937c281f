"""A value kept for the length of a run but never written to a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.errors import EmptyChannelError, InvalidUpdateError

Value = TypeVar("Value")


class UntrackedValue(BaseChannel[Value, Value]):
    """Holds the last value written, in memory only: ``checkpoint()`` is always ``MISSING``.

    With ``guard`` (the default) two writes in one step fail; without it the last one wins.
    A step without a write keeps the value.
    """

    __slots__ = ("guard", "value")

    def __init__(self, typ: Any, guard: bool = True, *, key: str = "") -> None:
        super().__init__(typ, key)
        self.guard = guard
        self.value: Any = MISSING

    def __eq__(self, other: object) -> bool:
        """Equal to another ``UntrackedValue`` with the same guard: compared by spec."""
        return isinstance(other, UntrackedValue) and other.guard == self.guard

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new, empty channel with this one's settings and key; ``checkpoint`` is ignored."""
        return type(self)(self.typ, self.guard, key=self.key)

    def copy(self) -> Self:
        """A copy that keeps the value.

        The base ``copy`` goes through ``checkpoint()``, which never carries this value; reads
        of a step's state on a copy of the channels (edges, branches) must still see it.
        """
        new = self.from_checkpoint(MISSING)
        new.value = self.value
        return new

    def checkpoint(self) -> Any:
        """Always ``MISSING``: the value is never stored."""
        return MISSING

    def get(self) -> Value:
        """The value last written in this run."""
        if self.value is MISSING:
            raise EmptyChannelError()
        value: Value = self.value
        return value

    def is_available(self) -> bool:
        """Whether a value has been written in this run."""
        return self.value is not MISSING

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
