"""InMemoryCache: entries by namespace and key, copies on read, TTL, clearing by namespace."""

from __future__ import annotations

import time

import pytest

from bulksync.cache.memory import InMemoryCache
from bulksync.coordinator.cached import cache_key, cache_namespace
from bulksync.errors import SerializationError
from bulksync.types import CachePolicy

NS_A = ("__pregel_ns_writes", "mod.a", "a")
NS_B = ("__pregel_ns_writes", "mod.b", "b")


def test_get_returns_only_live_entries_as_copies() -> None:
    cache = InMemoryCache()
    value = [["log", ["x"]]]
    cache.set({(NS_A, "k"): (value, None)})
    got = cache.get([(NS_A, "k"), (NS_A, "missing"), (NS_B, "k")])
    assert got == {(NS_A, "k"): value}
    got[(NS_A, "k")][0][1].append("changed")  # a reader's copy: the entry stays as set
    assert cache.get([(NS_A, "k")]) == {(NS_A, "k"): [["log", ["x"]]]}


def test_entries_expire_after_their_ttl() -> None:
    cache = InMemoryCache()
    cache.set({(NS_A, "short"): (1, 0.05), (NS_A, "forever"): (2, None)})  # type: ignore[dict-item]
    time.sleep(0.1)
    assert cache.get([(NS_A, "short"), (NS_A, "forever")]) == {(NS_A, "forever"): 2}


def test_clear_drops_the_namespaces_given_or_everything() -> None:
    cache = InMemoryCache()
    cache.set({(NS_A, "k"): (1, None), (NS_B, "k"): (2, None)})
    cache.clear([NS_A])
    assert cache.get([(NS_A, "k"), (NS_B, "k")]) == {(NS_B, "k"): 2}
    cache.clear()
    assert cache.get([(NS_B, "k")]) == {}


def test_a_value_that_cannot_be_stored_fails_when_set() -> None:
    with pytest.raises(SerializationError):
        InMemoryCache().set({(NS_A, "k"): (object(), None)})


def test_keys_follow_the_policys_key_func() -> None:
    def search(state: dict[str, str]) -> None: ...

    ns = cache_namespace("search", search)
    assert ns == ("__pregel_ns_writes", f"{__name__}.{search.__qualname__}", "search")
    same = cache_key(ns, CachePolicy(), {"q": "x"}) == cache_key(ns, CachePolicy(), {"q": "x"})
    assert same and cache_key(ns, CachePolicy(), {"q": "y"}) != cache_key(
        ns, CachePolicy(), {"q": "x"}
    )
    by_length = CachePolicy(key_func=lambda s: str(len(s["q"])))
    assert cache_key(ns, by_length, {"q": "ab"}) == cache_key(ns, by_length, {"q": "cd"})
    assert cache_namespace("lambda", None)[1] == "__dynamic__"


def test_an_input_with_no_msgpack_form_needs_a_key_func() -> None:
    ns = cache_namespace("search", None)
    with pytest.raises(SerializationError, match=r"cache_policy of 'search'.*key_func"):
        cache_key(ns, CachePolicy(), {"q": object()})
    assert cache_key(ns, CachePolicy(key_func=lambda s: "fixed"), {"q": object()})[1]
