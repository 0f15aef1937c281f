"""Runtime and context: ``invoke(..., context=...)`` reaches every node, subgraphs included.

The context class lives at module level: on a cluster the context travels to the workers
with the step, and a worker decodes it by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

import pytest

from .harness import Conform
from .impls import Impl

pytestmark = pytest.mark.conformance


@dataclasses.dataclass
class Context:
    user: str
    limit: int = 3


class State(TypedDict):
    seen: list[str]


def runtime_and_context(impl: Impl) -> Any:
    def injected(state: State, runtime: Any) -> dict[str, Any]:
        ctx = runtime.context
        info = runtime.execution_info
        return {"seen": [*state["seen"], f"injected:{ctx.user}:{ctx.limit}:{info.node_attempt}"]}

    def fetched(state: State) -> dict[str, Any]:
        ctx = impl.runtime.get_runtime(Context).context
        return {"seen": [*state["seen"], f"fetched:{ctx.user}"]}

    sub = impl.StateGraph(State, context_schema=Context)
    sub.add_node("fetched", fetched)
    sub.add_edge(impl.START, "fetched")
    b = impl.StateGraph(State, context_schema=Context)
    b.add_node("injected", injected)
    b.add_node("sub", impl.compile(sub))
    b.add_edge(impl.START, "injected")
    b.add_edge("injected", "sub")
    g = impl.compile(b)
    return {
        "instance": g.invoke({"seen": []}, context=Context(user="ada")),
        "dict": g.invoke({"seen": []}, context={"user": "bob", "limit": 7}),
        "stream": list(g.stream({"seen": []}, context=Context(user="cy"), stream_mode="values")),
    }


def test_runtime_and_context(conform: Conform) -> None:
    conform(runtime_and_context)
