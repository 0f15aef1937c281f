"""bulksync: LangGraph-compatible agent graphs on a bulk-synchronous-parallel core.

The everyday names are re-exported here; each also lives in the module LangGraph users
expect (``bulksync.graph``, ``bulksync.types``, ``bulksync.errors``, ``bulksync.config``).
They are loaded on first use (PEP 562), so importing one part of the package (say the pure
core, ``bulksync.coordinator.plan``) does not load the graph builder, the savers or SQLite.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulksync.exports import lazy_exports

if TYPE_CHECKING:
    from bulksync.config import get_config, get_stream_writer
    from bulksync.constants import END, START
    from bulksync.errors import (
        BulkSyncError,
        EmptyInputError,
        GraphInterrupt,
        GraphRecursionError,
        InvalidGraphError,
        InvalidUpdateError,
    )
    from bulksync.graph import CompiledStateGraph, MessagesState, StateGraph, add_messages
    from bulksync.types import Command, Interrupt, Overwrite, RetryPolicy, Send, interrupt

__all__ = [
    "END",
    "START",
    "BulkSyncError",
    "Command",
    "CompiledStateGraph",
    "EmptyInputError",
    "GraphInterrupt",
    "GraphRecursionError",
    "Interrupt",
    "InvalidGraphError",
    "InvalidUpdateError",
    "MessagesState",
    "Overwrite",
    "RetryPolicy",
    "Send",
    "StateGraph",
    "add_messages",
    "get_config",
    "get_stream_writer",
    "interrupt",
]

_HOMES = {
    "END": "bulksync.constants",
    "START": "bulksync.constants",
    "BulkSyncError": "bulksync.errors",
    "EmptyInputError": "bulksync.errors",
    "GraphInterrupt": "bulksync.errors",
    "GraphRecursionError": "bulksync.errors",
    "InvalidGraphError": "bulksync.errors",
    "InvalidUpdateError": "bulksync.errors",
    "CompiledStateGraph": "bulksync.graph",
    "MessagesState": "bulksync.graph",
    "StateGraph": "bulksync.graph",
    "add_messages": "bulksync.graph",
    "Command": "bulksync.types",
    "Interrupt": "bulksync.types",
    "Overwrite": "bulksync.types",
    "RetryPolicy": "bulksync.types",
    "Send": "bulksync.types",
    "interrupt": "bulksync.types",
    "get_config": "bulksync.config",
    "get_stream_writer": "bulksync.config",
}
"""The module each name of ``__all__`` is loaded from."""


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
