"""Fan-out: Send map-reduce, ordering of results, waiting edges, deferred nodes, drifting edges."""

from __future__ import annotations

import operator
import threading
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl
from .ordering import FinishOrder

pytestmark = pytest.mark.conformance


class MapState(TypedDict):
    topic: str
    subjects: list[str]
    results: Annotated[list[str], operator.add]
    summary: str


def map_reduce_reverse_finish(impl: Impl) -> Any:
    order = FinishOrder([3, 2, 1, 0])

    def plan(state: MapState) -> dict[str, Any]:
        return {"subjects": [f"{state['topic']}-{i}" for i in range(4)]}

    def fan_out(state: MapState) -> list[Any]:
        return [impl.Send("work", {"subject": s, "i": i}) for i, s in enumerate(state["subjects"])]

    def work(arg: dict[str, Any]) -> dict[str, Any]:
        order.run(arg["i"])
        return {"results": [arg["subject"].upper()]}

    def reduce(state: MapState) -> dict[str, Any]:
        return {"summary": "+".join(state["results"])}

    b = impl.StateGraph(MapState)
    b.add_node("plan", plan)
    b.add_node("work", work)
    b.add_node("reduce", reduce)
    b.add_edge(impl.START, "plan")
    b.add_conditional_edges("plan", fan_out, ["work"])
    b.add_edge("work", "reduce")
    g = impl.compile(b)
    chunks = list(g.stream({"topic": "t", "results": []}, stream_mode=["updates", "values"]))
    return {"chunks": chunks, "finished": order.finished, "timeouts": order.timeouts}


def test_map_reduce_reverse_finish(conform: Conform) -> None:
    conform(map_reduce_reverse_finish)


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def sends_beside_pull_task(impl: Impl) -> Any:
    order = FinishOrder([2, 1, 0])

    def route(state: Log) -> list[Any]:
        return [impl.Send("work", i) for i in range(3)] + ["other"]

    def work(i: int) -> dict[str, Any]:
        order.run(i)
        return {"log": [f"work{i}"]}

    def other(state: Log) -> dict[str, Any]:
        order.wait_all()  # the PULL task finishes after every PUSH task, yet is applied first
        return {"log": [f"other saw {len(state['log'])}"]}

    b = impl.StateGraph(Log)
    b.add_node("start", lambda s: {"log": ["start"]})
    b.add_node("work", work)
    b.add_node("other", other)
    b.add_edge(impl.START, "start")
    b.add_conditional_edges("start", route, ["work", "other"])
    g = impl.compile(b)
    values = list(g.stream({"log": []}, stream_mode="values"))
    return {"values": values, "finished": order.finished, "timeouts": order.timeouts}


def test_sends_beside_pull_task(conform: Conform) -> None:
    conform(sends_beside_pull_task)


def wide_fan_out(impl: Impl) -> Any:
    def route(state: Log) -> list[Any]:
        return [impl.Send("square", {"n": n}) for n in range(40)]

    b = impl.StateGraph(Log)
    b.add_node("square", lambda a: {"log": [str(a["n"] * a["n"])]})
    b.add_conditional_edges(impl.START, route, ["square"])
    g = impl.compile(b)
    return {"first": g.invoke({"log": []}), "second": g.invoke({"log": ["x"]})}


def test_wide_fan_out(conform: Conform) -> None:
    conform(wide_fan_out)


def nested_sends(impl: Impl) -> Any:
    def route(state: Log) -> list[Any]:
        return [impl.Send("split", {"depth": 0, "label": label}) for label in ("a", "b")]

    def split(arg: dict[str, Any]) -> Any:
        label, depth = arg["label"], arg["depth"]
        if depth == 2:
            return {"log": [f"leaf {label}"]}
        goto = [impl.Send("split", {"depth": depth + 1, "label": f"{label}{k}"}) for k in "xy"]
        return impl.Command(update={"log": [f"node {label}"]}, goto=goto)

    b = impl.StateGraph(Log)
    b.add_node("split", split)
    b.add_node("done", lambda s: {"log": [f"done {len(s['log'])}"]})
    b.add_conditional_edges(impl.START, route, ["split"])
    b.add_edge("split", "done")
    g = impl.compile(b)
    return {"values": list(g.stream({"log": []}, stream_mode="values"))}


def test_nested_sends(conform: Conform) -> None:
    conform(nested_sends)


def empty_send_list(impl: Impl) -> Any:
    b = impl.StateGraph(Log)
    b.add_node("prep", lambda s: {"log": ["prep"]})
    b.add_node("work", lambda a: {"log": [a]})
    b.add_edge(impl.START, "prep")
    b.add_conditional_edges("prep", lambda s: [impl.Send("work", x) for x in s["log"][1:]])
    g = impl.compile(b)
    return {
        "none": list(g.stream({"log": []}, stream_mode="updates")),
        "two": list(g.stream({"log": ["p", "q"]}, stream_mode="values")),
    }


def test_empty_send_list(conform: Conform) -> None:
    conform(empty_send_list)


class Calls:
    """Counts node calls by name, thread-safely."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.lock = threading.Lock()

    def node(self, name: str) -> Any:
        """A node that logs `name` and records each call."""

        def run(state: Log) -> dict[str, Any]:
            with self.lock:
                self.names.append(name)
            return {"log": [f"{name}@{len(state['log'])}"]}

        return run

    def count(self, name: str) -> int:
        """How many times `name` ran."""
        return self.names.count(name)


def _diamond(impl: Impl, calls: Calls, *, join: bool, defer: bool = False) -> Any:
    """START → a and b; b → b2; a and b2 lead to c (one barrier edge, or two plain edges)."""
    b = impl.StateGraph(Log)
    for name in ("a", "b", "b2"):
        b.add_node(name, calls.node(name))
    b.add_node("c", calls.node("c"), defer=defer)
    b.add_edge(impl.START, "a")
    b.add_edge(impl.START, "b")
    b.add_edge("b", "b2")
    if join:
        b.add_edge(["a", "b2"], "c")
    else:
        b.add_edge("a", "c")
        b.add_edge("b2", "c")
    return impl.compile(b)


def waiting_edge(impl: Impl) -> Any:
    calls = Calls()
    g = _diamond(impl, calls, join=True)
    values = list(g.stream({"log": []}, stream_mode="values"))
    return {"values": values, "c_calls": calls.count("c")}


def test_waiting_edge(conform: Conform) -> None:
    conform(waiting_edge)


def drifting_edges_fire_twice(impl: Impl) -> Any:
    calls = Calls()
    g = _diamond(impl, calls, join=False)
    values = list(g.stream({"log": []}, stream_mode="values"))
    return {"values": values, "c_calls": calls.count("c")}


def test_drifting_edges_fire_twice(conform: Conform) -> None:
    conform(drifting_edges_fire_twice)


def deferred_node(impl: Impl) -> Any:
    calls = Calls()
    g = _diamond(impl, calls, join=False, defer=True)
    values = list(g.stream({"log": []}, stream_mode="values"))
    return {"values": values, "c_calls": calls.count("c")}


def test_deferred_node(conform: Conform) -> None:
    conform(deferred_node)


def deferred_after_map(impl: Impl) -> Any:
    calls = Calls()

    def route(state: Log) -> list[Any]:
        return [impl.Send("item", n) for n in range(3)] + ["slow"]

    def item(n: int) -> dict[str, Any]:
        return {"log": [f"item{n}"]}

    b = impl.StateGraph(Log)
    b.add_node("start", calls.node("start"))
    b.add_node("item", item)
    b.add_node("slow", calls.node("slow"))
    b.add_node("slow2", calls.node("slow2"))
    b.add_node("collect", calls.node("collect"), defer=True)
    b.add_edge(impl.START, "start")
    b.add_conditional_edges("start", route, ["item", "slow"])
    b.add_edge("slow", "slow2")
    b.add_edge("item", "collect")
    b.add_edge("slow2", "collect")
    g = impl.compile(b)
    updates = list(g.stream({"log": []}, stream_mode="values"))
    return {"values": updates, "collect_calls": calls.count("collect")}


def test_deferred_after_map(conform: Conform) -> None:
    conform(deferred_after_map)


def same_step_edges_fire_once(impl: Impl) -> Any:
    calls = Calls()
    b = impl.StateGraph(Log)
    for name in ("a", "b", "c"):
        b.add_node(name, calls.node(name))
    b.add_edge(impl.START, "a")
    b.add_edge(impl.START, "b")
    b.add_edge("a", "c")
    b.add_edge("b", "c")
    g = impl.compile(b)
    return {"invoke": g.invoke({"log": []}), "c_calls": calls.count("c")}


def test_same_step_edges_fire_once(conform: Conform) -> None:
    conform(same_step_edges_fire_once)
