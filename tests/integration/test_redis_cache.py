"""RedisCache on a real Redis: entries by namespace and key, TTL, clearing by namespace within
its prefix, a Redis outage turning lookups into misses, and graphs sharing results through it."""

from __future__ import annotations

import logging
import operator
import time
import uuid
from typing import Annotated, Any, TypedDict

import pytest
import redis

from bulksync.cache.redis import RedisCache
from bulksync.errors import SerializationError
from bulksync.func import entrypoint, task
from bulksync.graph import START, StateGraph
from bulksync.types import CachePolicy

pytestmark = pytest.mark.integration

NS_A = ("__pregel_ns_writes", "mod.a", "a")
NS_ODD = ("__pregel_ns_writes", "mod:odd*[name]", "b?")
UNREACHABLE = "redis://127.0.0.1:1/0"


@pytest.fixture
def cache(redis_url: str) -> Any:
    made = RedisCache(redis_url, prefix=f"bulksync-test:{uuid.uuid4().hex[:8]}:")
    yield made
    made.clear()
    made.client.close()


def test_get_returns_only_the_entries_set(cache: RedisCache) -> None:
    cache.set({(NS_A, "k"): ([["log", ["x"]]], None), (NS_ODD, "k"): ({"n": 1}, None)})
    got = cache.get([(NS_A, "k"), (NS_A, "missing"), (NS_ODD, "k"), (NS_ODD, "other")])
    assert got == {(NS_A, "k"): [["log", ["x"]]], (NS_ODD, "k"): {"n": 1}}
    assert cache.get([]) == {}


def test_entries_expire_after_their_ttl(cache: RedisCache) -> None:
    cache.set({(NS_A, "short"): (1, 0.05), (NS_A, "forever"): (2, None)})  # type: ignore[dict-item]
    time.sleep(0.2)
    assert cache.get([(NS_A, "short"), (NS_A, "forever")]) == {(NS_A, "forever"): 2}
    assert cache.client.ttl(cache._key(NS_A, "forever")) == -1  # no expiry set


def test_clear_drops_the_namespaces_given_or_all_of_its_prefix(
    cache: RedisCache, redis_url: str
) -> None:
    other = RedisCache(redis_url, prefix=f"{cache.prefix[:-1]}-other:")
    try:
        other.set({(NS_A, "k"): ("kept", None)})
        cache.set({(NS_A, "k"): (1, None), (NS_ODD, "k"): (2, None)})
        cache.clear([NS_ODD])  # glob characters in a namespace are matched literally
        assert cache.get([(NS_A, "k"), (NS_ODD, "k")]) == {(NS_A, "k"): 1}
        cache.clear()
        assert cache.get([(NS_A, "k")]) == {}
        assert other.get([(NS_A, "k")]) == {(NS_A, "k"): "kept"}
    finally:
        other.clear()
        other.client.close()


def test_a_value_that_cannot_be_stored_fails_when_set(cache: RedisCache) -> None:
    with pytest.raises(SerializationError):
        cache.set({(NS_A, "k"): (object(), None)})


def test_an_empty_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="give a prefix"):
        RedisCache(prefix="")


def test_a_client_decoding_responses_is_refused(redis_url: str) -> None:
    with (
        redis.Redis.from_url(redis_url, decode_responses=True) as client,
        pytest.raises(ValueError, match="without decode_responses=True"),
    ):
        RedisCache(client)


def test_unreachable_redis_is_a_miss_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    cache = RedisCache(UNREACHABLE)
    with caplog.at_level(logging.WARNING, logger="bulksync.cache.redis"):
        assert cache.get([(NS_A, "k")]) == {}
        cache.set({(NS_A, "k"): (1, None)})
    assert "lookup in Redis failed, running the tasks instead" in caplog.text
    assert "storing 1 result(s) in Redis failed" in caplog.text
    with pytest.raises(redis.ConnectionError):
        cache.clear()


class State(TypedDict):
    q: str
    log: Annotated[list[str], operator.add]


def _graph(runs: list[str], cache: RedisCache) -> Any:
    def search(state: State) -> dict[str, Any]:
        runs.append(state["q"])
        return {"log": [f"found {state['q']}"]}

    b = StateGraph(State)
    b.add_node("search", search, cache_policy=CachePolicy(key_func=lambda s: s["q"]))
    b.add_edge(START, "search")
    return b.compile(cache=cache)


def test_graphs_share_node_results_through_redis(cache: RedisCache, redis_url: str) -> None:
    runs: list[str] = []
    first = _graph(runs, cache).invoke({"q": "cats", "log": []})
    # Another graph, another cache object on the same prefix: as another process would be.
    another = RedisCache(redis_url, prefix=cache.prefix)
    again = _graph(runs, another).invoke({"q": "cats", "log": []})
    another.client.close()
    assert first == again == {"q": "cats", "log": ["found cats"]}
    assert runs == ["cats"]


def test_a_cluster_shares_task_results_through_redis(cache: RedisCache, cluster: Any) -> None:
    calls: list[int] = []

    @task(cache_policy=CachePolicy())
    def square(i: int) -> int:
        calls.append(i)
        return i * i

    @entrypoint(cache=cache)
    def squares(n: int) -> list[int]:
        return [f.result() for f in [square(i) for i in range(n)]]

    attached = cluster.attach(squares)
    assert attached.invoke(3) == [0, 1, 4]
    assert squares.invoke(4) == [0, 1, 4, 9]  # in-process: only the new call runs
    assert sorted(calls) == [0, 1, 2, 3]
