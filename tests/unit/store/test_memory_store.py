"""``InMemoryStore``: the same answers as LangGraph's, and clear errors for bad use."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.store.base import PutOp as LangGraphPutOp
from langgraph.store.memory import InMemoryStore as LangGraphStore

from bulksync.errors import InvalidNamespaceError
from bulksync.store import BaseStore, InMemoryStore, PutOp


def session(store: Any, put_op: Any) -> list[Any]:
    """Writes, reads, searches and listings; what each returned (items as their dicts)."""
    seen: list[Any] = []
    store.put(("users", "ada"), "prefs", {"theme": "dark", "size": 3, "tags": ["a", "b"]})
    store.put(("users", "bob"), "prefs", {"theme": "light", "size": 5})
    store.put(("users",), "index", {"size": 1, "nested": {"deep": True}})
    store.put(("docs", "ada"), "d1", {"size": 9})
    store.put(("users", "bob"), "prefs", {"theme": "dark", "size": 7})  # replaces
    seen.append(store.get(("users", "bob"), "prefs").value)
    for prefix, kw in [
        (("users",), {}),
        (("users",), {"filter": {"theme": "dark"}}),
        (("users",), {"filter": {"size": {"$gte": 3, "$lt": 7}}}),
        (("users",), {"filter": {"size": {"$ne": 1}}}),
        ((), {"filter": {"nested": {"deep": True}}}),
        ((), {"filter": {"tags": ["a", "b"]}}),
        (("users",), {"limit": 1, "offset": 1}),
    ]:
        seen.append([(i.namespace, i.key, i.score) for i in store.search(prefix, **kw)])
    seen.append(store.list_namespaces())
    seen.append(store.list_namespaces(prefix=("users",), max_depth=1))
    seen.append(store.list_namespaces(suffix=("ada",)))
    seen.append(store.list_namespaces(prefix=("*", "bob")))
    seen.append(store.list_namespaces(limit=2, offset=1))
    store.delete(("users", "ada"), "prefs")
    seen.append(store.get(("users", "ada"), "prefs"))
    seen.append(store.batch([put_op(("x",), "k", {"v": 1}), put_op(("x",), "k", {"v": 2})]))
    seen.append(store.get(("x",), "k").value)
    # Last: LangGraph's store lists a namespace once a get has looked into it; bulksync's
    # lists only namespaces holding items.
    seen.append(store.get(("users", "eve"), "prefs"))
    return seen


def test_the_same_answers_as_langgraph() -> None:
    assert session(InMemoryStore(), PutOp) == session(LangGraphStore(), LangGraphPutOp)


def test_async_twins_give_the_sync_answers() -> None:
    store = InMemoryStore()

    async def go() -> Any:
        await store.aput(("a",), "k", {"v": 1})
        item = await store.aget(("a",), "k")
        found = await store.asearch(("a",), filter={"v": 1})
        spaces = await store.alist_namespaces(prefix=("a",))
        await store.adelete(("a",), "k")
        return item.value, [i.key for i in found], spaces, await store.aget(("a",), "k")

    assert asyncio.run(go()) == ({"v": 1}, ["k"], [("a",)], None)


@pytest.mark.parametrize(
    ("namespace", "words"),
    [
        ((), "cannot be empty"),
        (("a.b",), "periods"),
        (("",), "empty strings"),
        (("a", 3), "must be strings"),
        (("langgraph", "x"), 'cannot be "langgraph"'),
    ],
)
def test_bad_namespaces_are_named(namespace: tuple[Any, ...], words: str) -> None:
    with pytest.raises(InvalidNamespaceError, match=words):
        InMemoryStore().put(namespace, "k", {})
    assert issubclass(InvalidNamespaceError, ValueError)  # LangGraph's except clauses hold


def test_unknown_filter_operators_and_unsupported_features_say_so() -> None:
    store = InMemoryStore()
    with pytest.raises(ValueError, match=r"Unsupported operator: \$regex"):
        store.search(("a",), filter={"v": {"$regex": "x"}})
    with pytest.raises(NotImplementedError, match="filter"):
        store.search(("a",), query="similar things")
    with pytest.raises(NotImplementedError, match="TTL"):
        store.put(("a",), "k", {}, ttl=5)
    with pytest.raises(NotImplementedError, match="semantic"):
        InMemoryStore(index={"dims": 3})


def test_items_render_as_json_ready_dicts() -> None:
    store: BaseStore = InMemoryStore()
    store.put(("a",), "k", {"v": 1})
    item = store.get(("a",), "k")
    assert item is not None
    data = item.dict()
    assert (data["namespace"], data["key"], data["value"]) == (["a"], "k", {"v": 1})
    assert isinstance(data["created_at"], str)
