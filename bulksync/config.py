"""Access to the running node's config and custom stream (LangGraph's ``langgraph.config``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bulksync.context import current_task


def get_config() -> dict[str, Any]:
    """The config of the node running now.

    Raises:
        RuntimeError: outside a running node.
    """
    return current_task().config


def get_stream_writer() -> Callable[[Any], None]:
    """A function that emits a ``custom`` stream chunk from the node running now.

    Raises:
        RuntimeError: outside a running node.
    """
    return current_task().stream_writer


def get_store() -> Any:
    """The store of the run the node belongs to (``compile(store=...)``), or None.

    Raises:
        RuntimeError: outside a running node.
    """
    runtime = current_task().runtime
    return runtime.store if runtime is not None else None
