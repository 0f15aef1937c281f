"""``InMemoryCache``: node results cached in this process's memory.

Values are kept encoded (bulksync's msgpack serde), so a hit hands each reader its own copy
and a value that cannot be stored fails when it is set, as it would in any other cache. On a
cluster the coordinator consults it for node tasks, and each worker process keeps its own
for the ``@task`` calls it runs: ``cache.redis.RedisCache`` shares one across them all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bulksync.cache.base import BaseCache, FullKey, Namespace
from bulksync.checkpoint.serde import MsgpackSerde


class InMemoryCache(BaseCache):
    """Entries in a dict of namespaces, guarded by a lock; expired ones dropped when read."""

    def __init__(self) -> None:
        self._serde = MsgpackSerde()
        self._lock = threading.Lock()
        self._data: dict[Namespace, dict[str, tuple[bytes, float | None]]] = {}

    def get(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        """The values of those ``keys`` that have a live entry."""
        now = time.monotonic()
        found: dict[FullKey, Any] = {}
        with self._lock:
            for ns, key in keys:
                entry = self._data.get(ns, {}).get(key)
                if entry is None:
                    continue
                data, expires = entry
                if expires is not None and expires <= now:
                    del self._data[ns][key]
                    continue
                found[(ns, key)] = data
        return {k: self._serde.loads(v) for k, v in found.items()}

    def set(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        """Store each key's value for its time to live in seconds (None: no expiry)."""
        now = time.monotonic()
        encoded = {
            key: (self._serde.dumps(value), None if ttl is None else now + ttl)
            for key, (value, ttl) in pairs.items()
        }
        with self._lock:
            for (ns, key), entry in encoded.items():
                self._data.setdefault(ns, {})[key] = entry

    def clear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """Drop the entries of ``namespaces`` (None: all entries)."""
        with self._lock:
            if namespaces is None:
                self._data.clear()
            for ns in namespaces or ():
                self._data.pop(tuple(ns), None)


__all__ = ["InMemoryCache"]
