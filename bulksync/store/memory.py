"""``InMemoryStore``: a store in this process's memory, for tests and single-process runs.

Its results and their order are LangGraph's ``InMemoryStore``'s: ``search`` returns items in
the order their namespaces were first written, then their keys; ``list_namespaces`` sorts.
It has no semantic index (a ``query`` raises) and no TTL. On a cluster each worker process
would have its own: give a cluster graph a ``PostgresStore``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import UTC, datetime

from bulksync.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    matches,
    namespace_matches,
)


class InMemoryStore(BaseStore):
    """Items in a dict of namespaces, guarded by a lock (nodes run on several threads)."""

    def __init__(self, *, index: object = None) -> None:
        if index is not None:
            raise NotImplementedError(
                "InMemoryStore(index=...): bulksync's stores have no semantic (embedding) "
                "search yet; leave index out and search with filters."
            )
        self._data: dict[tuple[str, ...], dict[str, Item]] = {}
        self._lock = threading.Lock()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; writes to one item in a batch: the last one wins, applied
        after the batch's reads (as LangGraph's store does)."""
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        with self._lock:
            for op in ops:
                if isinstance(op, GetOp):
                    results.append(self._data.get(op.namespace, {}).get(op.key))
                elif isinstance(op, SearchOp):
                    results.append(self._search(op))
                elif isinstance(op, ListNamespacesOp):
                    results.append(self._namespaces(op))
                elif isinstance(op, PutOp):
                    puts[(op.namespace, op.key)] = op
                    results.append(None)
                else:
                    raise ValueError(f"Unknown operation type: {type(op).__name__}")
            for (namespace, key), put in puts.items():
                self._apply(namespace, key, put)
        return results

    def _apply(self, namespace: tuple[str, ...], key: str, put: PutOp) -> None:
        if put.value is None:
            self._data.get(namespace, {}).pop(key, None)
            return
        now = datetime.now(UTC)
        items = self._data.setdefault(namespace, {})
        items[key] = Item(dict(put.value), key, namespace, now, now)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        if op.query:
            raise NotImplementedError(
                "search(query=...): bulksync's stores have no semantic (embedding) search "
                "yet; search with filter=... instead."
            )
        width = len(op.namespace_prefix)
        found = [
            item
            for namespace, items in self._data.items()
            if namespace[:width] == op.namespace_prefix
            for item in items.values()
            if all(matches(item.value.get(k), v) for k, v in (op.filter or {}).items())
        ]
        return [
            SearchItem(i.value, i.key, i.namespace, i.created_at, i.updated_at)
            for i in found[op.offset : op.offset + op.limit]
        ]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = [ns for ns, items in self._data.items() if items] or []
        for condition in op.match_conditions or ():
            namespaces = [ns for ns in namespaces if namespace_matches(condition, ns)]
        if op.max_depth is not None:
            namespaces = list({ns[: op.max_depth] for ns in namespaces})
        return sorted(namespaces)[op.offset : op.offset + op.limit]
