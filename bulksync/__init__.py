"""bulksync: LangGraph-compatible agent graphs on a bulk-synchronous-parallel core.

The everyday names are re-exported here; each also lives in the module LangGraph users
expect (``bulksync.graph``, ``bulksync.types``, ``bulksync.errors``, ``bulksync.config``).
"""

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
