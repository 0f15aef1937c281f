"""Channels that keep the single value written last: plain state keys and deferred triggers.

``LastValue`` backs every state key without a reducer; ``LastValueAfterFinish`` backs the
trigger of a node added with ``defer=True``, which must run only once nothing else is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

from bulksync.channels.base import MISSING, BaseChannel, ValueChannel
from bulksync.errors import EmptyChannelError, InvalidUpdateError

Value = TypeVar("Value")


class LastValue(ValueChannel[Value, Value]):
    """Holds the one value written in the latest step that wrote it; two writes in a step fail."""

    __slots__ = ()

    def update(self, values: Sequence[Value]) -> bool:
        """Keep the step's single value; no write leaves the old value in place."""
        if not values:
            return False
        if len(values) > 1:
            raise InvalidUpdateError(
                f"At key '{self.key}': Can receive only one value per step. "
                "Use an Annotated key to handle multiple values."
            )
        self.value = values[0]
        return True


class LastValueAfterFinish(BaseChannel[Value, Value]):
    """Like ``LastValue``, but readable only after ``finish()``; ``consume()`` then empties it."""

    __slots__ = ("value", "finished")

    def __init__(self, typ: Any, key: str = "") -> None:
        super().__init__(typ, key)
        self.value: Any = MISSING
        self.finished = False

    def __eq__(self, other: object) -> bool:
        """Equal to any other ``LastValueAfterFinish``: channels compare by spec."""
        return isinstance(other, LastValueAfterFinish)

    __hash__ = None  # type: ignore[assignment]  # equality by spec: unhashable, like LangGraph

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new channel with this one's type and key, restored from ``(value, finished)``."""
        new = type(self)(self.typ, self.key)
        if checkpoint is not MISSING:
            # A list stands for the tuple once stored data has been through msgpack.
            new.value, new.finished = checkpoint
        return new

    def checkpoint(self) -> Any:
        """``(value, finished)``, or ``MISSING`` while no value is held."""
        if self.value is MISSING:
            return MISSING
        return (self.value, self.finished)

    def get(self) -> Value:
        """The value, once the run has finished with it pending."""
        if self.value is MISSING or not self.finished:
            raise EmptyChannelError()
        value: Value = self.value
        return value

    def is_available(self) -> bool:
        """Whether a value is held and ``finish()`` has released it."""
        return self.finished and self.value is not MISSING

    def update(self, values: Sequence[Value]) -> bool:
        """Keep the step's last value and hold it back until the next ``finish()``."""
        if not values:
            return False
        # Unlike LastValue, several writers are fine here: they all mean "run the deferred node".
        self.value = values[-1]
        self.finished = False
        return True

    def consume(self) -> bool:
        """Empty the channel once the deferred node it released has run."""
        if not self.finished:
            return False
        self.value = MISSING
        self.finished = False
        return True

    def finish(self) -> bool:
        """Release a held value; True when one was held and not yet released."""
        if self.finished or self.value is MISSING:
            return False
        self.finished = True
        return True
