"""Barriers that open once every named writer has written: ``add_edge([a, b], c)`` joins."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, BaseChannel
from bulksync.errors import EmptyChannelError, InvalidUpdateError

Value = TypeVar("Value")


def _record(key: str, names: frozenset[Any], seen: set[Any], values: Iterable[Any]) -> bool:
    """Add ``values`` to ``seen``; True when one was new.

    Raises:
        InvalidUpdateError: when a value is not one of ``names``.
    """
    changed = False
    for value in values:
        if value not in names:
            expected = ", ".join(sorted(repr(name) for name in names))
            raise InvalidUpdateError(
                f"At key '{key}': Value {value!r} not in {{{expected}}}. Only the nodes this "
                "barrier joins may write to it; add the writer to the join's sources."
            )
        if value not in seen:
            seen.add(value)
            changed = True
    return changed


class NamedBarrierValue(BaseChannel[None, Value]):
    """Available (as ``None``) once every name in ``names`` has been written; consumed on read."""

    __slots__ = ("names", "seen")

    def __init__(self, typ: Any, names: Iterable[Value], *, key: str = "") -> None:
        super().__init__(typ, key)
        self.names: frozenset[Value] = frozenset(names)
        self.seen: set[Value] = set()

    def __eq__(self, other: object) -> bool:
        """Equal to another ``NamedBarrierValue`` over the same names: compared by spec."""
        return isinstance(other, NamedBarrierValue) and other.names == self.names

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new barrier over the same names and key, with the stored names already seen."""
        new = type(self)(self.typ, self.names, key=self.key)
        if checkpoint is not MISSING:
            new.seen = set(checkpoint)
        return new

    def checkpoint(self) -> set[Value]:
        """A copy of the names seen so far (an empty set when none)."""
        return set(self.seen)

    def get(self) -> None:
        """``None`` once all names have been seen."""
        if self.seen != self.names:
            raise EmptyChannelError()

    def is_available(self) -> bool:
        """Whether every name has been seen."""
        return self.seen == self.names

    def update(self, values: Sequence[Value]) -> bool:
        """Mark the written names as seen; True when a new one arrived."""
        return _record(self.key, self.names, self.seen, values)

    def consume(self) -> bool:
        """Close the barrier again after the joined node ran."""
        if self.seen != self.names:
            return False
        self.seen = set()
        return True


class NamedBarrierValueAfterFinish(BaseChannel[None, Value]):
    """Like ``NamedBarrierValue``, but opens only at ``finish()``: joins into deferred nodes."""

    __slots__ = ("names", "seen", "finished")

    def __init__(self, typ: Any, names: Iterable[Value], *, key: str = "") -> None:
        super().__init__(typ, key)
        self.names: frozenset[Value] = frozenset(names)
        self.seen: set[Value] = set()
        self.finished = False

    def __eq__(self, other: object) -> bool:
        """Equal to another deferred barrier over the same names: compared by spec."""
        return isinstance(other, NamedBarrierValueAfterFinish) and other.names == self.names

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new barrier over the same names and key, restored from ``(seen, finished)``."""
        new = type(self)(self.typ, self.names, key=self.key)
        if checkpoint is not MISSING:
            # A list stands for the tuple once stored data has been through msgpack.
            seen, finished = checkpoint
            new.seen = set(seen)
            new.finished = bool(finished)
        return new

    def checkpoint(self) -> tuple[set[Value], bool]:
        """``(names seen, finished)``, the set copied."""
        return (set(self.seen), self.finished)

    def get(self) -> None:
        """``None`` once all names have been seen and the run has finished."""
        if not self.is_available():
            raise EmptyChannelError()

    def is_available(self) -> bool:
        """Whether every name has been seen and ``finish()`` has released the barrier."""
        return self.finished and self.seen == self.names

    def update(self, values: Sequence[Value]) -> bool:
        """Mark the written names as seen; True when a new one arrived."""
        return _record(self.key, self.names, self.seen, values)

    def consume(self) -> bool:
        """Close and reset the barrier after the deferred node ran."""
        if not self.is_available():
            return False
        self.seen = set()
        self.finished = False
        return True

    def finish(self) -> bool:
        """Release the barrier when every name has been seen."""
        if self.finished or self.seen != self.names:
            return False
        self.finished = True
        return True
