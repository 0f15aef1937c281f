"""Access to the running node's config and custom stream (LangGraph's ``langgraph.config``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, THREAD_ID
from bulksync.context import current_task, maybe_current_task

_COORDINATES = (THREAD_ID, CHECKPOINT_NS, CHECKPOINT_ID, "checkpoint_map")


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


def merge_configs(
    base: Mapping[str, Any] | None, override: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``override`` over ``base``: ``configurable`` and ``metadata`` merged key by key,
    ``tags`` joined, any other key replaced."""
    merged = dict(base or {})
    for key, value in (override or {}).items():
        if key in ("configurable", "metadata") and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **(value or {})}
        elif key == "tags" and merged.get(key):
            merged[key] = [*merged[key], *(t for t in value or () if t not in merged[key])]
        else:
            merged[key] = value
    return merged


def addresses_own_thread(config: Mapping[str, Any] | None) -> bool:
    """Whether ``config`` names a checkpoint of its own (a thread id, a namespace, a
    checkpoint id): a graph invoked from a node with such a config is a run of its own on
    that thread, not a subgraph of the node, as in LangGraph. The running node's own config
    handed on (its namespace is the node's task's) is not: that call is a subgraph's."""
    configurable = (config or {}).get("configurable") or {}
    if not any(configurable.get(key) not in (None, "") for key in _COORDINATES):
        return False
    ctx = maybe_current_task()
    own = ctx.config.get("configurable", {}).get(CHECKPOINT_NS) if ctx is not None else None
    return own is None or configurable.get(CHECKPOINT_NS) != own
