"""The store: ``compile(store=...)`` reaches nodes as a ``store`` parameter, ``runtime.store``
and ``get_store()``, subgraphs included; what one run writes the next run reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

if TYPE_CHECKING:  # LangGraph injects ``store`` into a parameter annotated so, or bare
    from bulksync.store import BaseStore

pytestmark = pytest.mark.conformance


class Memory(TypedDict):
    user: str
    notes: list[str]


def memory_across_runs(impl: Impl) -> Any:
    def remember(state: Memory, store: BaseStore) -> dict[str, Any]:
        namespace = ("notes", state["user"])
        count = len(store.search(namespace))
        store.put(namespace, f"n{count}", {"text": f"note {count}", "n": count})
        return {"notes": [i.value["text"] for i in store.search(namespace, limit=100)]}

    def recall(state: Memory, runtime: Any) -> dict[str, Any]:
        found = runtime.store.search(("notes", state["user"]), filter={"n": {"$gte": 1}})
        return {"notes": [*state["notes"], f"later notes: {len(found)}"]}

    def listing(state: Memory) -> dict[str, Any]:
        spaces = impl.get_store().list_namespaces(prefix=("notes",))
        return {"notes": [*state["notes"], f"users: {len(spaces)}"]}

    sub = impl.StateGraph(Memory)
    sub.add_node("listing", listing)
    sub.add_edge(impl.START, "listing")
    b = impl.StateGraph(Memory)
    b.add_node("remember", remember)
    b.add_node("recall", recall)
    b.add_node("sub", impl.compile(sub))
    b.add_edge(impl.START, "remember")
    b.add_edge("remember", "recall")
    b.add_edge("recall", "sub")
    store = impl.store.InMemoryStore()
    graph = impl.compile(b, store=store)
    runs = [graph.invoke({"user": user, "notes": []}) for user in ("ada", "ada", "bob", "ada")]
    return {"runs": runs, "kept": sorted(store.list_namespaces())}


def test_memory_across_runs(conform: Conform) -> None:
    conform(memory_across_runs)


def entrypoint_with_store(impl: Impl) -> Any:
    store = impl.store.InMemoryStore()

    @impl.entrypoint(store=store, checkpointer=impl.saver())
    def visits(user: str, *, store: BaseStore) -> int:
        seen = store.get(("visits",), user)
        count = (seen.value["count"] if seen is not None else 0) + 1
        store.put(("visits",), user, {"count": count})
        return int(count)

    thread = {"configurable": {"thread_id": "visits"}}
    return [visits.invoke(user, thread) for user in ("ada", "bob", "ada")]


def test_entrypoint_with_store(conform: Conform) -> None:
    conform(entrypoint_with_store)
