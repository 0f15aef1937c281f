"""LangChain Runnables as node actions: recognised, named and called as LangGraph does."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from typing import Any

from langchain_core.runnables import RunnableLambda

from bulksync.graph.runnable import is_runnable, runnable_call, runnable_name


def double(state: dict[str, Any]) -> dict[str, Any]:
    return {"n": state["n"] * 2}


async def double_later(state: dict[str, Any]) -> dict[str, Any]:
    return {"n": state["n"] * 2}


def test_runnables_are_recognised_and_functions_are_not() -> None:
    assert is_runnable(RunnableLambda(double))
    assert is_runnable(RunnableLambda(double) | RunnableLambda(double))
    assert not is_runnable(double) and not is_runnable(object())


def test_a_runnable_is_named_by_get_name() -> None:
    assert runnable_name(RunnableLambda(double)) == "double"


def test_the_call_passes_state_and_config() -> None:
    seen: list[Any] = []

    def record(state: dict[str, Any], config: Any) -> dict[str, Any]:
        seen.append(config["configurable"]["thread_id"])
        return state

    call = runnable_call(RunnableLambda(record))
    assert call({"n": 1}, {"configurable": {"thread_id": "t1"}}) == {"n": 1}
    assert seen == ["t1"]


def test_an_async_only_runnable_is_awaited() -> None:
    call = runnable_call(RunnableLambda(double_later))
    assert inspect.iscoroutinefunction(call)
    assert asyncio.run(call({"n": 2}, {})) == {"n": 4}
    assert not inspect.iscoroutinefunction(runnable_call(RunnableLambda(double)))


def test_checking_never_imports_langchain() -> None:
    code = (
        "import sys; from bulksync.graph.runnable import is_runnable; "
        "assert not is_runnable(len); assert 'langchain_core' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
