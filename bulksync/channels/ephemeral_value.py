"""A value that lives for one step: the graph input and the ``branch:to:<node>`` triggers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from bulksync.channels.base import MISSING, GuardedValueChannel

Value = TypeVar("Value")


class EphemeralValue(GuardedValueChannel[Value]):
    """Holds the value written in the step just before; a step without a write clears it.

    With ``guard`` (the default) two writes in one step fail; without it the last one wins.
    """

    __slots__ = ()

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
        self.value = self.step_value(values)
        return True
