"""A value that many writers may set at once, on the promise that they all write the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from bulksync.channels.base import MISSING, ValueChannel

Value = TypeVar("Value")


class AnyValue(ValueChannel[Value, Value]):
    """Holds the last value written in the latest step; a step without a write clears it.

    Several writes in one step are accepted (the last is kept) because they are assumed equal.
    """

    __slots__ = ()

    def update(self, values: Sequence[Value]) -> bool:
        """Keep the step's last value, or drop the held one when the step wrote nothing."""
        if not values:
            if self.value is MISSING:
                return False
            self.value = MISSING
            return True
        self.value = values[-1]
        return True
