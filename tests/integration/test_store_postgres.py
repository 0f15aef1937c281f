"""``PostgresStore`` on a real Postgres: the in-memory store's answers, TTLs, and sharing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from bulksync.errors import InvalidNamespaceError, ServiceUnavailableError
from bulksync.store import InMemoryStore
from bulksync.store.postgres import PostgresStore

pytestmark = pytest.mark.integration


@pytest.fixture
def store(pg_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore.from_conn_string(pg_schema, max_size=2) as opened:
        opened.setup()
        yield opened


def contents(store: Any) -> list[Any]:
    """The same writes on any store; what reads, filtered searches and listings give, in an
    order both stores agree on (Postgres returns the newest-updated first)."""
    store.put(("users", "ada"), "prefs", {"theme": "dark", "size": 3, "tags": ["a", "b"]})
    store.put(("users", "bob"), "prefs", {"theme": "light", "size": 5})
    store.put(("users",), "index", {"size": 1, "nested": {"deep": True}})
    store.put(("docs", "ada"), "d1", {"size": 9, "label": "x"})
    store.put(("users", "bob"), "prefs", {"theme": "dark", "size": 7})
    seen: list[Any] = [store.get(("users", "bob"), "prefs").value]
    for prefix, kw in [
        (("users",), {}),
        (("users",), {"filter": {"theme": "dark"}}),
        (("users",), {"filter": {"size": {"$gte": 3, "$lt": 7}}}),
        (("users",), {"filter": {"size": {"$ne": 1}}}),
        ((), {"filter": {"nested": {"deep": True}}}),
        ((), {"filter": {"tags": ["a", "b"]}}),
        (("use",), {}),  # a prefix of a label is not a namespace prefix
    ]:
        seen.append(sorted((i.namespace, i.key) for i in store.search(prefix, **kw)))
    seen.append(store.list_namespaces())
    seen.append(store.list_namespaces(prefix=("users",), max_depth=1))
    seen.append(store.list_namespaces(suffix=("ada",)))
    seen.append(store.list_namespaces(prefix=("*", "bob")))
    store.delete(("users", "ada"), "prefs")
    seen.append(store.get(("users", "ada"), "prefs"))
    return seen


def test_the_same_answers_as_the_in_memory_store(store: PostgresStore) -> None:
    assert contents(store) == contents(InMemoryStore())


def test_search_pages_newest_first(store: PostgresStore) -> None:
    for n in range(5):
        store.put(("pages",), f"k{n}", {"n": n})
    pages = [[i.key for i in store.search(("pages",), limit=2, offset=o)] for o in (0, 2, 4)]
    assert pages == [["k4", "k3"], ["k2", "k1"], ["k0"]]
    first = store.get(("pages",), "k0")
    store.put(("pages",), "k0", {"n": 10})
    again = store.get(("pages",), "k0")
    assert first is not None and again is not None
    assert again.created_at == first.created_at and again.updated_at > first.updated_at


def test_items_with_a_ttl_expire_and_reads_refresh_them(store: PostgresStore) -> None:
    store.put(("ttl",), "short", {"v": 1}, ttl=0.02)  # 1.2 s
    store.put(("ttl",), "kept", {"v": 2})
    assert store.get(("ttl",), "short") is not None
    time.sleep(0.8)
    assert store.get(("ttl",), "short") is not None  # read: expiry pushed 1.2 s on
    time.sleep(0.8)
    assert store.get(("ttl",), "short", refresh_ttl=False) is not None
    time.sleep(0.6)
    assert store.get(("ttl",), "short") is None
    assert [i.key for i in store.search(("ttl",))] == ["kept"]
    assert store.sweep_ttl() == 1


def test_two_stores_on_one_database_share_items(store: PostgresStore, pg_schema: str) -> None:
    with PostgresStore.from_conn_string(pg_schema, max_size=1) as other:
        other.put(("shared",), "k", {"from": "other"})
    item = store.get(("shared",), "k")
    assert item is not None and item.value == {"from": "other"}


def test_bad_input_is_named_and_writes_nothing(store: PostgresStore) -> None:
    with pytest.raises(InvalidNamespaceError, match="periods"):
        store.put(("a.b",), "k", {"v": 1})
    with pytest.raises(ValueError, match=r"Unsupported operator: \$in"):
        store.search(("a",), filter={"v": {"$in": [1]}})
    with pytest.raises(NotImplementedError, match="filter"):
        store.search(("a",), query="nearest")
    assert store.list_namespaces() == []


def test_an_unreachable_database_fails_at_once_naming_it() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    opening = PostgresStore.from_conn_string(url, connect_timeout=1)
    with pytest.raises(ServiceUnavailableError, match="Cannot connect to Postgres at"), opening:
        pass
