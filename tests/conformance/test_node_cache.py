"""Node caches (``compile(cache=...)`` with a ``cache_policy``): a task whose input was seen
before takes the earlier writes instead of running, streamed with ``{"cached": True}``
metadata; ``key_func`` decides what counts as the same input; ``@task`` calls with a policy
are cached by their arguments; ``clear_cache`` forgets."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    query: str
    log: Annotated[list[str], operator.add]


def _graph(impl: Impl, calls: list[str], **policy: Any) -> Any:
    def search(state: State) -> dict[str, Any]:
        calls.append(state["query"])
        return {"log": [f"found {state['query']}"]}

    def answer(state: State) -> dict[str, Any]:
        calls.append("answer")
        return {"log": ["answered"]}

    b = impl.StateGraph(State)
    b.add_node("search", search, cache_policy=impl.CachePolicy(**policy))
    b.add_node("answer", answer)
    b.add_edge(impl.START, "search")
    b.add_edge("search", "answer")
    return impl.compile(b, checkpointer=impl.saver(), cache=impl.cache.InMemoryCache())


def node_cache(impl: Impl) -> Any:
    calls: list[str] = []
    graph = _graph(impl, calls)
    runs = {}
    for i, query in enumerate(["weather", "weather", "news"]):
        config = {"configurable": {"thread_id": f"cache-{i}"}}
        runs[f"{i} {query}"] = list(graph.stream({"query": query, "log": []}, config))
    by_length: list[str] = []
    keyed = _graph(impl, by_length, key_func=lambda state: str(len(state["query"])))
    for i, query in enumerate(["abc", "xyz"]):
        keyed.invoke({"query": query, "log": []}, {"configurable": {"thread_id": f"key-{i}"}})
    return {"runs": runs, "calls": calls, "keyed calls": by_length}


def test_node_cache(conform: Conform) -> None:
    conform(node_cache)


def clearing_the_node_cache(impl: Impl) -> Any:
    calls: list[str] = []
    graph = _graph(impl, calls)
    for i in range(3):
        if i == 2:
            graph.clear_cache()
        graph.invoke({"query": "weather", "log": []}, {"configurable": {"thread_id": f"c{i}"}})
    return calls


def test_clearing_the_node_cache(conform: Conform) -> None:
    conform(clearing_the_node_cache)


def cached_task_calls(impl: Impl) -> Any:
    calls: list[int] = []

    @impl.func.task(cache_policy=impl.CachePolicy())
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    @impl.entrypoint(checkpointer=impl.saver(), cache=impl.cache.InMemoryCache())
    def doubles(xs: list[int]) -> list[int]:
        return [double(x).result() for x in xs]

    out = [
        doubles.invoke([1, 2, 1], {"configurable": {"thread_id": "t1"}}),
        doubles.invoke([2, 3], {"configurable": {"thread_id": "t2"}}),
    ]
    return {"out": out, "calls": calls}


def test_cached_task_calls(conform: Conform) -> None:
    conform(cached_task_calls)
