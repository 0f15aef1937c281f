"""Node results from a node cache (``compile(cache=...)`` and a node's ``cache_policy``).

A task of a node with a cache policy has a cache key: the node's namespace (LangGraph's
``("__pregel_ns_writes", <function identifier>, <node name>)``) and a hash of what the
policy's ``key_func`` makes of the task's input. Before a step runs, its tasks with an
entry take their writes from the cache instead of running; a task that finishes with writes
(no error, no pause) leaves them there for ``ttl`` seconds. ``@task`` calls are cached the
same way, by their arguments (``workers/calls.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bulksync.cache.base import FullKey, Namespace
from bulksync.checkpoint.serde import MsgpackSerde
from bulksync.constants import CACHE_NS_WRITES
from bulksync.coordinator.spec import Write
from bulksync.errors import SerializationError
from bulksync.types import CachePolicy

_SERDE = MsgpackSerde()


def cache_namespace(name: str, func: Callable[..., Any] | None) -> Namespace:
    """The namespace of the cached results of node (or ``@task``) ``name`` running ``func``."""
    return (CACHE_NS_WRITES, _identifier(func) or "__dynamic__", name)


def cache_key(ns: Namespace, policy: CachePolicy, *args: Any, **kwargs: Any) -> FullKey:
    """The entry of a call with these arguments (a node's: its input).

    Raises:
        SerializationError: without a ``key_func``, arguments msgpack cannot encode.
    """
    if policy.key_func is None:
        try:
            raw = _SERDE.dumps([list(args), kwargs])
        except SerializationError as exc:
            raise SerializationError(
                f"cache_policy of '{ns[-1]}': its input has no msgpack form to key the cache "
                f"by ({exc}); give CachePolicy a key_func."
            ) from exc
    else:
        made = policy.key_func(*args, **kwargs)
        raw = made if isinstance(made, bytes) else str(made).encode()
    return ns, hashlib.sha256(raw).hexdigest()


def cached_writes(cache: Any, keys: Mapping[str, FullKey]) -> dict[str, list[Write]]:
    """The writes the cache holds for tasks, by task id (only those with an entry)."""
    if not keys:
        return {}
    found = cache.get(list(keys.values()))
    return {
        task_id: [(chan, value) for chan, value in found[key]]
        for task_id, key in keys.items()
        if key in found
    }


def keep_writes(cache: Any, key: FullKey, writes: Sequence[Write], ttl: int | None) -> None:
    """Leave a finished task's writes in the cache."""
    cache.set({key: ([[chan, value] for chan, value in writes], ttl)})


def _identifier(func: Callable[..., Any] | None) -> str | None:
    target = getattr(func, "__func__", func)  # a bound method: its function
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if module is None or name is None:
        return None
    return f"{module}.{name}"


__all__ = ["cache_key", "cache_namespace", "cached_writes", "keep_writes"]
