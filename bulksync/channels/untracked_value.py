"""A value kept for the length of a run but never written to a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, GuardedValueChannel

Value = TypeVar("Value")


class UntrackedValue(GuardedValueChannel[Value]):
    """Holds the last value written, in memory only: ``checkpoint()`` is always ``MISSING``.

    With ``guard`` (the default) two writes in one step fail; without it the last one wins.
    A step without a write keeps the value.
    """

    __slots__ = ()

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
        self.value = self.step_value(values)
        return True
