"""The reducer channel behind ``Annotated[T, reducer]`` state keys, with ``Overwrite`` support."""

from __future__ import annotations

import collections.abc
import operator
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, Required, Self, TypeVar, cast

from bulksync.channels.base import MISSING, ValueChannel
from bulksync.errors import InvalidUpdateError
from bulksync.types import Overwrite

Value = TypeVar("Value")

OVERWRITE_KEY = "__overwrite__"
"""The key of the dict spelling of ``Overwrite``: ``{"__overwrite__": value}``."""

# Abstract collection types cannot be instantiated; an empty value of the concrete type can.
_CONCRETE: dict[Any, type] = {
    collections.abc.Sequence: list,
    collections.abc.MutableSequence: list,
    collections.abc.Set: set,
    collections.abc.MutableSet: set,
    collections.abc.Mapping: dict,
    collections.abc.MutableMapping: dict,
}


def bare_type(typ: Any) -> Any:
    """``typ`` without ``Annotated``/``Required``/``NotRequired`` and type arguments."""
    origin = getattr(typ, "__origin__", None)
    if origin is None:
        return typ
    if origin is Required or origin is NotRequired:
        return bare_type(typ.__args__[0])
    # Annotated[X, ...] has X as its origin, list[int] has list: unwrap until a plain class.
    return bare_type(origin)


def initial_value(typ: Any) -> Any:
    """The empty value a reducer key starts from: ``T()`` when that works, else ``MISSING``."""
    factory = bare_type(typ)
    try:
        return _CONCRETE.get(factory, factory)()
    # Whatever a user type raises when built without arguments just means "starts empty".
    except Exception:
        return MISSING


def as_overwrite(value: Any) -> tuple[bool, Any]:
    """``(True, replacement)`` for an ``Overwrite`` in any spelling, else ``(False, None)``.

    Besides ``Overwrite(v)`` this accepts ``{"__overwrite__": v}`` and
    ``{"type": "__overwrite__", "value": v}``, the shape an ``Overwrite`` takes after JSON.
    """
    if isinstance(value, Overwrite):
        return True, value.value
    if isinstance(value, dict):
        if len(value) == 1 and OVERWRITE_KEY in value:
            return True, value[OVERWRITE_KEY]
        if value.get("type") == OVERWRITE_KEY and "value" in value:
            return True, value["value"]
    return False, None


def _same_operator(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """Whether two reducers count as the same; every lambda is alike, so any lambda matches."""
    if getattr(a, "__name__", None) == "<lambda>" or getattr(b, "__name__", None) == "<lambda>":
        return True
    return a is b


class BinaryOperatorAggregate(ValueChannel[Value, Value | Overwrite]):
    """Folds each written value into the current one with ``operator(current, written)``."""

    __slots__ = ("operator",)

    def __init__(
        self, typ: Any, operator: Callable[[Value, Value], Value], *, key: str = ""
    ) -> None:
        super().__init__(typ, key)
        self.operator = operator
        self.value: Any = initial_value(typ)

    def __eq__(self, other: object) -> bool:
        """Equal to another reducer channel with the same operator: compared by spec."""
        return isinstance(other, BinaryOperatorAggregate) and _same_operator(
            self.operator, other.operator
        )

    def blank(self) -> Self:
        """A new channel with this one's type, operator and key, at the type's empty value."""
        return type(self)(self.typ, self.operator, key=self.key)

    def from_checkpoint(self, checkpoint: Any) -> Self:
        """A new channel holding ``checkpoint`` (the type's empty value for ``MISSING``)."""
        return self.blank() if checkpoint is MISSING else super().from_checkpoint(checkpoint)

    def update(self, values: Sequence[Value | Overwrite]) -> bool:
        """Fold the step's values in order; an ``Overwrite`` replaces the step's result.

        Values before an ``Overwrite`` are folded and then replaced; values after it are
        ignored. Errors raised by the operator propagate unchanged.

        Raises:
            InvalidUpdateError: when the step holds more than one ``Overwrite``.
        """
        if not values:
            return False
        overwritten = False
        folded: list[Any] | None = None  # a list this call made: extended in place, below
        for index, value in enumerate(values):
            is_overwrite, replacement = as_overwrite(value)
            if is_overwrite:
                if overwritten:
                    raise InvalidUpdateError(
                        f"At key '{self.key}': Can receive only one Overwrite value per "
                        "super-step. Let a single node overwrite this key in a step."
                    )
                overwritten = True
                self.value = replacement
            elif overwritten:
                continue
            elif index == 0 and self.value is MISSING:
                # Nothing to fold into yet: the first value becomes the start value.
                self.value = value
            elif self.operator is operator.add and type(value) is list and type(self.value) is list:
                # list + list, without copying the list so far for each value (a fan-out of
                # n results folded n times): the same list, in a list no one else holds.
                if self.value is not folded:
                    folded = list(self.value)
                folded.extend(value)
                self.value = cast(Value, folded)
            else:
                # Not an Overwrite in any spelling, so it is a plain update.
                self.value = self.operator(self.value, cast(Value, value))
        return True
