"""Graphs the HTTP API tests serve: ``bulksync api``, ``coordinator`` and ``worker`` processes
load this module (``--graph tests.integration.api.graphs``).

``fanout``: one ``Send`` per item to ``square``, a reducer sums them up (each waits
``seconds``: for cancelling and watching a run in progress). ``approval``: asks for approval
with ``interrupt`` and records the answer. ``nested``: ``approval`` as a subgraph node.
"""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

from bulksync.graph import END, START, StateGraph
from bulksync.types import Send, interrupt


class Numbers(TypedDict, total=False):
    items: list[int]
    seconds: float
    squares: Annotated[list[int], operator.add]
    total: int


def _each(state: Numbers) -> list[Send]:
    return [Send("square", {"n": n, "seconds": state.get("seconds", 0.0)}) for n in state["items"]]


def _square(task: dict[str, Any]) -> dict[str, Any]:
    if task["seconds"]:
        time.sleep(task["seconds"])
    if task["n"] < 0:
        raise ValueError(f"cannot square a negative number here: {task['n']}")
    return {"squares": [task["n"] * task["n"]]}


def _sum(state: Numbers) -> dict[str, Any]:
    return {"total": sum(state["squares"])}


def _fanout() -> Any:
    builder = StateGraph(Numbers)
    builder.add_node("square", _square)
    builder.add_node("sum", _sum)
    builder.add_conditional_edges(START, _each, ["square"])
    builder.add_edge("square", "sum")
    builder.add_edge("sum", END)
    return builder.compile()


class Request(TypedDict, total=False):
    text: str
    decision: str
    log: Annotated[list[str], operator.add]


def _draft(state: Request) -> dict[str, Any]:
    return {"log": [f"drafted {state['text']}"]}


def _approve(state: Request) -> dict[str, Any]:
    decision = interrupt({"question": "approve?", "text": state["text"]})
    return {"decision": decision, "log": [f"decided {decision}"]}


def _approval() -> Any:
    builder = StateGraph(Request)
    builder.add_node("draft", _draft)
    builder.add_node("approve", _approve)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", END)
    return builder.compile()


fanout = _fanout()
approval = _approval()


class Outer(TypedDict, total=False):
    text: str
    decision: str
    log: Annotated[list[str], operator.add]


def _wrap(state: Outer) -> dict[str, Any]:
    return {"log": ["wrapped"]}


def _nested() -> Any:
    """``approval`` as a subgraph node: its interrupt pauses the outer graph."""
    builder = StateGraph(Outer)
    builder.add_node("review", approval)
    builder.add_node("wrap", _wrap)
    builder.add_edge(START, "review")
    builder.add_edge("review", "wrap")
    builder.add_edge("wrap", END)
    return builder.compile()


nested = _nested()
