"""Prebuilt agent parts, as ``langgraph.prebuilt`` offers them (needs the ``agents`` extra).

``create_react_agent``, ``ToolNode``, ``tools_condition``, ``InjectedState`` and
``InjectedStore``. Loaded on first use, so importing ``bulksync.prebuilt`` costs nothing
until one is used (langchain-core is imported then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulksync.exports import lazy_exports

if TYPE_CHECKING:
    from bulksync.prebuilt.react_agent import AgentState, create_react_agent
    from bulksync.prebuilt.tool_node import (
        InjectedState,
        InjectedStore,
        ToolNode,
        tools_condition,
    )

__all__ = [
    "AgentState",
    "InjectedState",
    "InjectedStore",
    "ToolNode",
    "create_react_agent",
    "tools_condition",
]

_HOMES = {
    "AgentState": "bulksync.prebuilt.react_agent",
    "create_react_agent": "bulksync.prebuilt.react_agent",
    "InjectedState": "bulksync.prebuilt.tool_node",
    "InjectedStore": "bulksync.prebuilt.tool_node",
    "ToolNode": "bulksync.prebuilt.tool_node",
    "tools_condition": "bulksync.prebuilt.tool_node",
}
"""The module each name of ``__all__`` is loaded from."""

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
