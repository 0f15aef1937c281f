"""``get_graph()`` as LangChain's ``Graph``, when langchain-core is installed.

LangGraph's ``get_graph()`` returns ``langchain_core.runnables.graph.Graph``, and programs call
its methods: ``draw_mermaid_png()``, ``draw_ascii()``, ``draw_png()``, ``to_json()``, or read
``nodes`` and ``edges``. bulksync lays the drawing out itself (``DrawableGraph``, whose Mermaid
text is LangGraph's to the byte) and hands the same nodes, edges and metadata to a LangChain
``Graph`` when langchain-core can be imported; without it, the ``DrawableGraph`` is returned
(it draws Mermaid text too).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from bulksync.constants import NS_END
from bulksync.graph.drawing import DrawableGraph


def langchain_available() -> bool:
    """Whether langchain-core can be imported here (the ``agents`` extra)."""
    return importlib.util.find_spec("langchain_core") is not None


def to_langchain_graph(drawing: DrawableGraph, actions: Mapping[str, Any]) -> Any:
    """``drawing`` as a ``langchain_core.runnables.graph.Graph``.

    A node's ``data`` is its action where it is a Runnable (LangChain draws those), else
    None; a node drawn inside a subgraph (``parent:child``) keeps its own name, as LangChain's
    ``Graph.extend`` names it.
    """
    from langchain_core.runnables import Runnable
    from langchain_core.runnables.graph import Edge, Graph, Node

    graph = Graph()
    for node_id in drawing.nodes:
        action = actions.get(node_id)
        graph.nodes[node_id] = Node(
            id=node_id,
            name=node_id.rsplit(NS_END, 1)[-1],
            data=action if isinstance(action, Runnable) else None,
            metadata=drawing.metadata.get(node_id) or None,
        )
    graph.edges = [Edge(e.source, e.target, e.label, e.conditional) for e in drawing.edges]
    return graph
