"""Managed values, as ``langgraph.managed`` has them: state keys the engine fills in.

A state key annotated ``RemainingSteps`` reads as how many supersteps the run may still take
before its recursion limit; one annotated ``IsLastStep`` as whether this is the last one. They
are no channels: nothing writes them, no checkpoint stores them, ``get_state()`` does not show
them. The loop computes them for each step and nodes and branches read them with the state,
so an agent can stop gracefully instead of failing with ``GraphRecursionError``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Final


@dataclasses.dataclass(frozen=True, slots=True)
class ManagedValue:
    """Marks a state key as computed by the engine (its ``kind``), in ``Annotated[T, …]``."""

    kind: str


REMAINING_STEPS: Final = ManagedValue("remaining_steps")
IS_LAST_STEP: Final = ManagedValue("is_last_step")

RemainingSteps = Annotated[int, REMAINING_STEPS]
"""A state key holding how many supersteps the run may still take."""

IsLastStep = Annotated[bool, IS_LAST_STEP]
"""A state key holding whether this superstep is the run's last before its limit."""


def managed_kind(annotation: Any) -> str | None:
    """The kind of managed value ``annotation`` declares (also under ``Required`` or
    ``NotRequired``), or None for a plain key."""
    if typing.get_origin(annotation) in (typing.Required, typing.NotRequired):
        annotation = typing.get_args(annotation)[0]
    for item in getattr(annotation, "__metadata__", ()):
        if isinstance(item, ManagedValue):
            return item.kind
    return None


def managed_values(managed: Mapping[str, str], step: int, stop: int) -> dict[str, Any]:
    """The value of each managed key (``key -> kind``) in superstep ``step`` of a run that
    stops at ``stop``, as LangGraph computes them."""
    found: dict[str, Any] = {}
    for key, kind in managed.items():
        found[key] = stop - step if kind == REMAINING_STEPS.kind else step == stop - 1
    return found


__all__ = ["IsLastStep", "ManagedValue", "RemainingSteps", "managed_values"]
