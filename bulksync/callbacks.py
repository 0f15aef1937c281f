"""Graph lifecycle callbacks (``langgraph.callbacks``' API): a run paused, a run resumed.

A ``GraphCallbackHandler`` in a run's ``callbacks`` (a list of handlers or a LangChain
callback manager) hears ``on_interrupt`` when the run pauses on interrupts (its own or a
breakpoint) and ``on_resume`` when a run goes on from a paused or saved checkpoint. Other
handlers in the same list are not called. A handler that raises is logged and the run goes
on, unless it sets ``raise_error`` (LangChain's rule for every callback). This module is
LangChain's callback protocol, so it needs langchain-core (the ``agents`` extra).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.callbacks.manager import ahandle_event, handle_event

from bulksync.types import Interrupt

GraphLifecycleStatus: TypeAlias = Literal[
    "input", "pending", "done", "interrupt_before", "interrupt_after", "out_of_steps"
]
"""Where the run stood when the event happened."""


@dataclass(frozen=True)
class GraphInterruptEvent:
    """A run paused: the interrupts it waits on, at which checkpoint."""

    run_id: UUID | None
    status: GraphLifecycleStatus
    checkpoint_id: str
    checkpoint_ns: tuple[str, ...]
    interrupts: tuple[Interrupt, ...]


@dataclass(frozen=True)
class GraphResumeEvent:
    """A run went on from a saved checkpoint (after a pause, or to continue a thread)."""

    run_id: UUID | None
    status: GraphLifecycleStatus
    checkpoint_id: str
    checkpoint_ns: tuple[str, ...]


GraphLifecycleEvent: TypeAlias = GraphInterruptEvent | GraphResumeEvent


class GraphCallbackHandler(BaseCallbackHandler):
    """A LangChain callback handler that also hears a graph's pauses and resumptions."""

    def on_interrupt(self, event: GraphInterruptEvent) -> Any:
        """The run paused on ``event.interrupts``."""

    def on_resume(self, event: GraphResumeEvent) -> Any:
        """The run resumed from ``event.checkpoint_id``."""


def graph_handlers(config: Mapping[str, Any]) -> list[GraphCallbackHandler]:
    """The ``GraphCallbackHandler``s among a config's callbacks."""
    callbacks = config.get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        callbacks = callbacks.handlers
    elif isinstance(callbacks, BaseCallbackHandler):
        callbacks = [callbacks]
    return [h for h in callbacks or () if isinstance(h, GraphCallbackHandler)]


def announce(handlers: list[GraphCallbackHandler], event: GraphLifecycleEvent) -> None:
    """Call each handler's ``on_interrupt`` or ``on_resume`` with ``event`` (an async one
    on an event loop of its own: the run's threads have none)."""
    method = "on_interrupt" if isinstance(event, GraphInterruptEvent) else "on_resume"
    is_async = [inspect.iscoroutinefunction(getattr(h, method)) for h in handlers]
    plain = [h for h, a in zip(handlers, is_async, strict=True) if not a]
    awaited = [h for h, a in zip(handlers, is_async, strict=True) if a]
    if plain:
        handle_event(plain, method, None, event)  # type: ignore[arg-type]
    if awaited:
        coro = ahandle_event(awaited, method, None, event)  # type: ignore[arg-type]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # never inside a running loop
            pool.submit(asyncio.run, coro).result()


__all__ = [
    "GraphCallbackHandler",
    "GraphInterruptEvent",
    "GraphLifecycleEvent",
    "GraphLifecycleStatus",
    "GraphResumeEvent",
]
