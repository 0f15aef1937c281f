"""CancelScope: coroutines and runs stopped together, from any thread."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from bulksync.constants import ASYNC_CALLER
from bulksync.workers.cancel_scope import (
    CancelScope,
    current_scope,
    mark_async_caller,
    run_coroutine,
    scoped_context,
    usable_home,
    within,
)


def test_cancel_reaches_a_coroutine_running_on_another_thread() -> None:
    scope = CancelScope()
    started = threading.Event()
    outcome: list[str] = []

    async def sleeper() -> None:
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    def run() -> None:
        with pytest.raises(asyncio.CancelledError):
            scope.run(sleeper())

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(2)
    t0 = time.monotonic()
    scope.cancel()
    thread.join(2)
    assert outcome == ["cancelled"] and time.monotonic() - t0 < 1


def test_after_cancel_new_work_starts_cancelled_and_stops_run_at_once() -> None:
    scope = CancelScope()
    scope.cancel()
    stopped: list[str] = []
    scope.on_cancel(lambda: stopped.append("run"))
    assert stopped == ["run"]
    with pytest.raises(asyncio.CancelledError):
        scope.run(asyncio.sleep(5))


def test_run_coroutine_uses_the_callers_scope() -> None:
    scope = CancelScope()
    with within(scope):
        assert current_scope() is scope
        assert run_coroutine(asyncio.sleep(0, result=3)) == 3
    assert current_scope() is None


# -- the async caller's loop ------------------------------------------------------------


def test_a_scope_runs_its_coroutines_on_its_home_loop_in_the_callers_context() -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")

    async def where() -> tuple[str, str]:
        return threading.current_thread().name, marker.get()

    async def main() -> tuple[str, str]:
        scope = CancelScope(home=asyncio.get_running_loop())

        def on_a_thread() -> tuple[str, str]:
            marker.set("the task's")
            return scope.run(where())  # type: ignore[no-any-return]

        return await asyncio.to_thread(on_a_thread)

    assert asyncio.run(main()) == ("MainThread", "the task's")


def test_a_home_loop_is_usable_only_off_its_own_thread_and_while_it_runs() -> None:
    """From the home loop's own thread (a coroutine there blocked in a sync call) it is no
    home: work sent there would wait for the loop it blocks."""

    async def main() -> tuple[object, object]:
        home = asyncio.get_running_loop()
        elsewhere = await asyncio.to_thread(usable_home, home)
        return usable_home(home), elsewhere is home

    assert asyncio.run(main()) == (None, True)
    idle = asyncio.new_event_loop()
    try:
        assert usable_home(idle) is None  # not running: no home
    finally:
        idle.close()


def test_graphs_invoked_by_async_nodes_never_wait_for_themselves() -> None:
    from typing import TypedDict

    from bulksync.graph import START, StateGraph

    class S(TypedDict, total=False):
        where: str

    async def inner_node(state: S) -> S:
        return {"where": threading.current_thread().name}

    inner = StateGraph(S).add_node("inner_node", inner_node).add_edge(START, "inner_node")
    compiled = inner.compile()

    async def blocking(state: S) -> S:
        return compiled.invoke({})  # type: ignore[no-any-return]

    async def awaiting(state: S) -> S:
        return await compiled.ainvoke({})  # type: ignore[no-any-return]

    def sync_node(state: S) -> S:
        return compiled.invoke({})  # type: ignore[no-any-return]

    async def main() -> dict[str, str]:
        seen = {}
        for node in (blocking, awaiting, sync_node):
            graph = StateGraph(S).add_node("n", node).add_edge(START, "n").compile()
            seen[node.__name__] = (await asyncio.wait_for(graph.ainvoke({}), 10))["where"]
        return seen

    seen = asyncio.run(main())
    assert seen["awaiting"] == seen["sync_node"] == "MainThread"  # the caller's loop
    assert seen["blocking"] != "MainThread"  # its own loop, on a task thread


def test_the_async_caller_mark_is_set_by_the_caller_not_inherited() -> None:
    configurable: dict[str, object] = {ASYNC_CALLER: True}
    mark_async_caller(configurable)
    assert ASYNC_CALLER not in configurable  # a node's config handed on: dropped
    kept: dict[str, object] = {ASYNC_CALLER: True}
    mark_async_caller(kept, inherited=False)
    assert kept == {ASYNC_CALLER: True}  # a client's run on a service: kept

    async def main() -> dict[str, object]:
        _, context = scoped_context(home=asyncio.get_running_loop())
        marked: dict[str, object] = {}
        await asyncio.to_thread(context.run, mark_async_caller, marked)
        return marked

    assert asyncio.run(main()) == {ASYNC_CALLER: True}
