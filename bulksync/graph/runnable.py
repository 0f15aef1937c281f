"""LangChain Runnables as nodes: ``RunnableLambda``, tools, sequences, prebuilt agent graphs.

LangGraph accepts any ``Runnable`` as a node's action and calls it with the state and the
node's config. bulksync does the same without depending on langchain-core: an object can only
be a ``Runnable`` if langchain-core is loaded already, so the check looks the class up in the
loaded modules and never imports it. The node runs ``invoke``, or ``ainvoke`` where LangGraph
would (``runnable_call``), named as LangGraph names it, ``get_name()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from bulksync.constants import ASYNC_CALLER


def is_runnable(action: Any) -> bool:
    """Whether ``action`` is a LangChain ``Runnable`` (never imports langchain-core)."""
    module = sys.modules.get("langchain_core.runnables.base")
    runnable = getattr(module, "Runnable", None)
    return isinstance(runnable, type) and isinstance(action, runnable)


def runnable_name(action: Any) -> str:
    """The node name LangGraph gives a Runnable added without one: its ``get_name()``."""
    return str(action.get_name())


def runnable_call(action: Any, *, prefer_async: bool = False) -> Callable[..., Any]:
    """A node function calling the Runnable ``action`` with the state and the node's config.

    Its ``ainvoke`` when it has only an async function, or when ``prefer_async`` (a timed
    node) and it has one of its own; else its ``ainvoke`` in a run an async caller started
    (as LangGraph does, so a ``ToolNode`` runs async tools there) and its ``invoke`` in any
    other.
    """
    native = _native_async(action)
    if _only_async(action) or (prefer_async and native):

        async def call_async(state: Any, config: Any) -> Any:
            return await action.ainvoke(state, config)

        return call_async

    def call(state: Any, config: Any) -> Any:
        if native and (config.get("configurable") or {}).get(ASYNC_CALLER):
            return action.ainvoke(state, config)  # awaited (in-process: on the caller's loop)
        return action.invoke(state, config)

    return call


def _only_async(action: Any) -> bool:
    return not callable(getattr(action, "func", None)) and callable(getattr(action, "afunc", None))


def _native_async(action: Any) -> bool:
    """Whether ``action``'s ``ainvoke`` is its own (a ``RunnableLambda`` given an async
    function, or a class that overrides it), not the base's ``invoke`` run on a thread."""
    base = sys.modules["langchain_core.runnables.base"]
    if isinstance(action, base.RunnableLambda):
        return callable(getattr(action, "afunc", None))
    return type(action).ainvoke is not base.Runnable.ainvoke
