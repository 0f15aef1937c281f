"""Long-term memory shared across threads: ``BaseStore``, as ``langgraph.store.base`` has it.

Items are JSON objects filed under a namespace (a tuple of labels) and a key. A store answers
batches of four operations (``GetOp``, ``SearchOp``, ``PutOp``, ``ListNamespacesOp``); the
methods users call (``get``, ``search``, ``put``, ``delete``, ``list_namespaces`` and their
``a``-prefixed twins) validate their arguments, build the operation and run a batch of one.
A backend implements ``batch`` only; the async twins run the sync methods on a worker thread,
so no behaviour is kept twice.

Filters (``search(filter=...)``) compare item values as Postgres compares ``jsonb``: a plain
value is equality (nested dicts and lists compared element-wise), a dict of operators applies
``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from bulksync.errors import InvalidNamespaceError

NamespacePath = tuple[str, ...]
"""A namespace pattern for ``list_namespaces``: labels, ``"*"`` matching any one."""

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


class NotProvided:
    """The default of ``put(ttl=...)``: the store's own default TTL applies."""

    def __repr__(self) -> str:
        return "NOT_PROVIDED"


NOT_PROVIDED = NotProvided()


@dataclasses.dataclass(slots=True)
class Item:
    """A stored value (a JSON object) with where it is filed and when it was written."""

    value: dict[str, Any]
    key: str
    namespace: tuple[str, ...]
    created_at: datetime
    updated_at: datetime

    def dict(self) -> dict[str, Any]:
        """The item as JSON-ready data (times as ISO strings)."""
        return {
            "namespace": list(self.namespace),
            "key": self.key,
            "value": self.value,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclasses.dataclass(slots=True)
class SearchItem(Item):
    """An item found by ``search``; ``score`` is its relevance to a query, if one was given."""

    score: float | None = None

    def dict(self) -> dict[str, Any]:
        """The item as JSON-ready data, with its score."""
        return {**Item.dict(self), "score": self.score}


@dataclasses.dataclass(frozen=True, slots=True)
class GetOp:
    """Read one item."""

    namespace: tuple[str, ...]
    key: str
    refresh_ttl: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class SearchOp:
    """Find items under a namespace prefix whose values match ``filter``."""

    namespace_prefix: tuple[str, ...]
    filter: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0
    query: str | None = None
    refresh_ttl: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class MatchCondition:
    """A namespace pattern: ``path`` at its start (``prefix``) or end (``suffix``)."""

    match_type: Literal["prefix", "suffix"]
    path: NamespacePath


@dataclasses.dataclass(frozen=True, slots=True)
class ListNamespacesOp:
    """List the namespaces holding items, matching every condition, cut to ``max_depth``."""

    match_conditions: tuple[MatchCondition, ...] | None = None
    max_depth: int | None = None
    limit: int = 100
    offset: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class PutOp:
    """Store ``value`` (``None``: delete the item); ``ttl`` in minutes (``None``: forever)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any] | None
    index: Literal[False] | list[str] | None = None
    ttl: float | None = None


Op = GetOp | SearchOp | PutOp | ListNamespacesOp
Result = Item | list[SearchItem] | list[tuple[str, ...]] | None


class BaseStore(ABC):
    """A key-value store of JSON objects under hierarchical namespaces (LangGraph's API)."""

    supports_ttl: bool = False
    """Whether items may expire (``put(ttl=minutes)``)."""
    ttl_config: Mapping[str, Any] | None = None
    """``default_ttl`` (minutes) and ``refresh_on_read`` (default True), when TTLs apply."""

    @abstractmethod
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; one result each (``None`` for puts)."""

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch`` for async callers."""
        return await asyncio.to_thread(self.batch, list(ops))

    def get(
        self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None
    ) -> Item | None:
        """The item at ``namespace``/``key``, or None.

        Raises:
            InvalidNamespaceError: a label is empty, not a string, or holds ``.``.
        """
        check_labels(namespace)
        result = self.batch([GetOp(tuple(namespace), str(key), self._refresh(refresh_ttl))])[0]
        return result if isinstance(result, Item) else None

    def search(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """Items under ``namespace_prefix`` whose values match ``filter``, ``limit`` from
        ``offset``.

        Raises:
            InvalidNamespaceError: a bad label in the prefix.
            ValueError: a filter operator other than ``$eq $ne $gt $gte $lt $lte``.
            NotImplementedError: a ``query``: this store has no semantic index.
        """
        check_labels(namespace_prefix)
        check_filter(filter)
        op = SearchOp(
            tuple(namespace_prefix), filter, limit, offset, query, self._refresh(refresh_ttl)
        )
        result = self.batch([op])[0]
        return result if isinstance(result, list) else []  # type: ignore[return-value]

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        """Store ``value`` at ``namespace``/``key`` (replacing what was there); ``ttl``:
        minutes until it expires.

        Raises:
            InvalidNamespaceError: an empty namespace, a bad label, or a root label
                ``langgraph`` (reserved).
            NotImplementedError: a ``ttl`` given to a store without TTL support.
        """
        check_namespace(namespace)
        if ttl not in (NOT_PROVIDED, None) and not self.supports_ttl:
            raise NotImplementedError(
                f"{type(self).__name__} does not support TTL: leave ttl out, or use a store "
                "with TTL support (bulksync's PostgresStore)."
            )
        minutes = self._default_ttl() if isinstance(ttl, NotProvided) else ttl
        self.batch([PutOp(tuple(namespace), str(key), dict(value), index, minutes)])

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        """Remove the item at ``namespace``/``key`` (nothing if there is none)."""
        check_labels(namespace)
        self.batch([PutOp(tuple(namespace), str(key), None)])

    def list_namespaces(
        self,
        *,
        prefix: NamespacePath | None = None,
        suffix: NamespacePath | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding items, sorted, those matching ``prefix``/``suffix`` only,
        each cut to ``max_depth`` labels."""
        conditions = [MatchCondition("prefix", tuple(prefix))] if prefix else []
        if suffix:
            conditions.append(MatchCondition("suffix", tuple(suffix)))
        op = ListNamespacesOp(tuple(conditions) or None, max_depth, limit, offset)
        result = self.batch([op])[0]
        return result if isinstance(result, list) else []  # type: ignore[return-value]

    async def aget(
        self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None
    ) -> Item | None:
        """``get`` for async callers."""
        return await asyncio.to_thread(self.get, namespace, key, refresh_ttl=refresh_ttl)

    async def asearch(
        self, namespace_prefix: tuple[str, ...], /, **kwargs: Any
    ) -> list[SearchItem]:
        """``search`` for async callers."""
        return await asyncio.to_thread(lambda: self.search(namespace_prefix, **kwargs))

    async def aput(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        """``put`` for async callers."""
        await asyncio.to_thread(self.put, namespace, key, value, index, ttl=ttl)

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        """``delete`` for async callers."""
        await asyncio.to_thread(self.delete, namespace, key)

    async def alist_namespaces(self, **kwargs: Any) -> list[tuple[str, ...]]:
        """``list_namespaces`` for async callers."""
        return await asyncio.to_thread(lambda: self.list_namespaces(**kwargs))

    def _refresh(self, refresh_ttl: bool | None) -> bool:
        if refresh_ttl is not None:
            return refresh_ttl
        return bool((self.ttl_config or {}).get("refresh_on_read", True))

    def _default_ttl(self) -> float | None:
        value = (self.ttl_config or {}).get("default_ttl")
        return None if value is None else float(value)


def check_labels(namespace: Sequence[Any]) -> None:
    """Raise ``InvalidNamespaceError`` for a label that is not a non-empty string free of
    ``.`` and NUL (a ``.`` would let ``("a.b",)`` address ``("a", "b")``)."""
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespaceError(
                f"Invalid namespace label '{label}' found in {tuple(namespace)}. Namespace "
                f"labels must be strings, but got {type(label).__name__}."
            )
        if not label:
            raise InvalidNamespaceError(
                f"Namespace labels cannot be empty strings. Got {label!r} in {tuple(namespace)}"
            )
        if "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label '{label}' found in {tuple(namespace)}. Namespace "
                "labels cannot contain periods ('.') or NUL bytes."
            )


def check_namespace(namespace: Sequence[Any]) -> None:
    """``check_labels``, and the namespace is not empty nor rooted at ``langgraph``."""
    if not namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    check_labels(namespace)
    if namespace[0] == "langgraph":
        raise InvalidNamespaceError(
            f'Root label for namespace cannot be "langgraph". Got: {tuple(namespace)}'
        )


def check_filter(filter: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` naming an operator the filter uses that no store knows."""
    for value in (filter or {}).values():
        if isinstance(value, Mapping):
            unknown = [k for k in value if k.startswith("$") and k not in OPERATORS]
            if unknown:
                known = ", ".join(sorted(OPERATORS))
                raise ValueError(f"Unsupported operator: {unknown[0]} (use one of {known})")


def matches(value: Any, wanted: Any) -> bool:
    """Whether a stored value matches a filter value (``jsonb`` comparison rules)."""
    if isinstance(wanted, Mapping):
        if any(str(k).startswith("$") for k in wanted):
            return all(_compare(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, Mapping) and all(
            matches(value.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(matches(a, b) for a, b in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _compare(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if value is None:
        return False
    left, right = float(value), float(operand)
    if op == "$gt":
        return left > right
    if op == "$gte":
        return left >= right
    if op == "$lt":
        return left < right
    if op == "$lte":
        return left <= right
    raise ValueError(f"Unsupported operator: {op}")


def namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with the condition's
    path, ``"*"`` matching any one label."""
    path = condition.path
    if len(namespace) < len(path):
        return False
    labels = (
        namespace if condition.match_type == "prefix" else namespace[len(namespace) - len(path) :]
    )
    return all(p in ("*", n) for n, p in zip(labels, path, strict=False))
