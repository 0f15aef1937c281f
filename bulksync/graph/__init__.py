"""The graph builder API, module for module like ``langgraph.graph``."""

from bulksync.constants import END, START
from bulksync.graph.compiled import CompiledStateGraph
from bulksync.graph.message import REMOVE_ALL_MESSAGES, MessageGraph, MessagesState, add_messages
from bulksync.graph.state import StateGraph

__all__ = [
    "END",
    "REMOVE_ALL_MESSAGES",
    "START",
    "CompiledStateGraph",
    "MessageGraph",
    "MessagesState",
    "StateGraph",
    "add_messages",
]
