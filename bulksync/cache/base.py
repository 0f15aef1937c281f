"""What a node cache is: ``BaseCache``, LangGraph's cache interface.

Entries are keyed by a ``FullKey``: a namespace (for a node, ``("__pregel_ns_writes", its
function's identifier, its name)``) and a key made from the input by the node's
``CachePolicy.key_func``; each has an optional time to live. A cache object with the same
methods (LangGraph's own caches) works as well: the engine calls only ``get``, ``set`` and
``clear``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

Namespace = tuple[str, ...]
"""Where a node's (or a ``@task``'s) entries live; clearing works by namespace."""

FullKey = tuple[Namespace, str]
"""One entry's address: its namespace and its key."""


class BaseCache(abc.ABC):
    """A node cache: entries by ``FullKey``, each set with a time to live (None: forever)."""

    @abc.abstractmethod
    def get(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        """The values of those ``keys`` that have a live entry."""

    @abc.abstractmethod
    def set(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        """Store each key's value for its time to live in seconds (None: no expiry)."""

    @abc.abstractmethod
    def clear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """Drop the entries of ``namespaces`` (None: all entries)."""

    async def aget(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        """``get`` for async callers."""
        return self.get(keys)

    async def aset(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        """``set`` for async callers."""
        self.set(pairs)

    async def aclear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """``clear`` for async callers."""
        self.clear(namespaces)


__all__ = ["BaseCache", "FullKey", "Namespace"]
