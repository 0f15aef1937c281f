"""A publish/subscribe channel collecting every value written: the queue of pending ``Send``s."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.errors import EmptyChannelError

Value = TypeVar("Value")


def flatten(values: Sequence[Value | list[Value]]) -> Iterator[Value]:
    """Each value in order, with the items of any ``list`` value in its place (one level)."""
    for value in values:
        if isinstance(value, list):
            yield from value
        else:
            yield value


class Topic(BaseChannel[Sequence[Value], Value | list[Value]]):
    """The values written in the last step that wrote any, or since the start if ``accumulate``."""

    __slots__ = ("accumulate", "values")

    def __init__(self, typ: Any, accumulate: bool = False, *, key: str = "") -> None:
        super().__init__(typ, key)
        self.accumulate = accumulate
        self.values: list[Value] = []

    def __eq__(self, other: object) -> bool:
        """Equal to another ``Topic`` that accumulates alike: compared by spec."""
        return isinstance(other, Topic) and other.accumulate == self.accumulate

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new ``Topic`` with this one's settings and key, holding the stored values."""
        new = type(self)(self.typ, self.accumulate, key=self.key)
        if checkpoint is not MISSING:
            # Copied so that appending to the live channel never alters a stored checkpoint.
            new.values = list(checkpoint)
        return new

    def checkpoint(self) -> list[Value]:
        """A copy of the values held (an empty list when there are none)."""
        return list(self.values)

    def get(self) -> Sequence[Value]:
        """A copy of the values held."""
        if not self.values:
            raise EmptyChannelError()
        return list(self.values)

    def is_available(self) -> bool:
        """Whether any value is held."""
        return bool(self.values)

    def update(self, values: Sequence[Value | list[Value]]) -> bool:
        """Append the step's values (lists flattened), first dropping old ones unless accumulating.

        An empty step therefore clears a non-accumulating topic; True when that or an append
        changed what is held.
        """
        changed = False
        if not self.accumulate and self.values:
            self.values = []
            changed = True
        size = len(self.values)
        self.values.extend(flatten(values))
        return changed or len(self.values) > size
