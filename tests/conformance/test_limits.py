"""Limits and failures: recursion limit, retry policies, failed steps resumed, empty input."""

from __future__ import annotations

import asyncio
import itertools
import operator
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform, attempt, collect
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


class Flaky(Exception):
    """A failure the default retry policy retries (not a programming error)."""


class Counter:
    """Counts calls per node name, thread-safely."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def hit(self, name: str) -> int:
        """Record one call of `name`; return how many calls it has had so far."""
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            return self.calls[name]


def _chain(impl: Impl, counter: Counter, names: str) -> Any:
    """A straight graph through `names`, each node counting its calls."""
    b = impl.StateGraph(State)
    for name in names:
        b.add_node(name, lambda s, name=name: {"log": [name], "n": counter.hit(name)})
    b.add_edge(impl.START, names[0])
    for left, right in itertools.pairwise(names):
        b.add_edge(left, right)
    return impl.compile(b)


def recursion_limit_boundary(impl: Impl) -> Any:
    out: dict[str, Any] = {}
    for limit in (3, 4, 5, 6):
        counter = Counter()
        g = _chain(impl, counter, "abcd")
        result = collect(g.stream({"log": []}, {"recursion_limit": limit}, stream_mode="updates"))
        out[f"limit_{limit}"] = {"chunks": result, "calls": dict(sorted(counter.calls.items()))}
    return out


def test_recursion_limit_boundary(conform: Conform) -> None:
    conform(recursion_limit_boundary)


def recursion_self_loop(impl: Impl) -> Any:
    counter = Counter()
    b = impl.StateGraph(State)
    b.add_node("spin", lambda s: {"n": counter.hit("spin")})
    b.add_edge(impl.START, "spin")
    b.add_conditional_edges("spin", lambda s: "spin" if s["n"] < 100 else impl.END)
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "loop"}, "recursion_limit": 5}
    err = attempt(g.invoke, {"log": [], "n": 0}, cfg)
    state = g.get_state(cfg)
    return {
        "error": err,
        "calls": counter.calls,
        "values": state.values,
        "next": state.next,
        "history": len(list(g.get_state_history(cfg))),
        "bad_limit": attempt(g.invoke, {"log": []}, {**cfg, "recursion_limit": 0}),
    }


def test_recursion_self_loop(conform: Conform) -> None:
    conform(recursion_self_loop)


def _flaky_graph(
    impl: Impl, counter: Counter, fail_times: int, exc: type[Exception], **kw: Any
) -> Any:
    """START → flaky → after; `flaky` raises `exc` on its first `fail_times` calls."""

    def flaky(state: State) -> dict[str, Any]:
        attempt_no = counter.hit("flaky")
        if attempt_no <= fail_times:
            raise exc(f"attempt {attempt_no}")
        return {"log": [f"ok on {attempt_no}"]}

    b = impl.StateGraph(State)
    b.add_node("flaky", flaky, **kw)
    b.add_node("after", lambda s: {"n": counter.hit("after")})
    b.add_edge(impl.START, "flaky")
    b.add_edge("flaky", "after")
    return impl.compile(b)


def _fast_policy(impl: Impl, **kw: Any) -> Any:
    """A RetryPolicy with tiny, deterministic waits."""
    return impl.RetryPolicy(initial_interval=0.01, jitter=False, **kw)


def retry_flaky_node(impl: Impl) -> Any:
    counter = Counter()
    g = _flaky_graph(impl, counter, 2, Flaky, retry_policy=_fast_policy(impl))
    chunks = list(g.stream({"log": []}, stream_mode=["updates", "values"]))
    return {"chunks": chunks, "calls": counter.calls}


def test_retry_flaky_node(conform: Conform) -> None:
    conform(retry_flaky_node)


def retry_exhausted(impl: Impl) -> Any:
    counter = Counter()
    policy = _fast_policy(impl, max_attempts=4)
    g = _flaky_graph(impl, counter, 10, Flaky, retry_policy=policy)
    err = attempt(g.invoke, {"log": []})
    return {"error": err, "message": str(err), "calls": counter.calls}


def test_retry_exhausted(conform: Conform) -> None:
    conform(retry_exhausted)


def no_retry_by_default(impl: Impl) -> Any:
    counter = Counter()
    g = _flaky_graph(impl, counter, 1, Flaky)
    return {"error": attempt(g.invoke, {"log": []}), "calls": counter.calls}


def test_no_retry_by_default(conform: Conform) -> None:
    conform(no_retry_by_default)


def retry_on_filters(impl: Impl) -> Any:
    out: dict[str, Any] = {}
    cases = {
        "default_skips_value_error": (ValueError, _fast_policy(impl)),
        "default_retries_connection_error": (ConnectionError, _fast_policy(impl)),
        "only_key_error_skips_flaky": (Flaky, _fast_policy(impl, retry_on=KeyError)),
        "tuple_matches": (Flaky, _fast_policy(impl, retry_on=(KeyError, Flaky))),
        "callable_matches": (ValueError, _fast_policy(impl, retry_on=lambda e: "1" in str(e))),
        "first_matching_policy": (
            KeyError,
            [_fast_policy(impl, retry_on=Flaky), _fast_policy(impl, retry_on=KeyError)],
        ),
    }
    for name, (exc, policy) in cases.items():
        counter = Counter()
        g = _flaky_graph(impl, counter, 1, exc, retry_policy=policy)
        out[name] = {"result": attempt(g.invoke, {"log": []}), "calls": counter.calls}
    return out


def test_retry_on_filters(conform: Conform) -> None:
    conform(retry_on_filters)


def retry_policy_defaults(impl: Impl) -> Any:
    policy = impl.RetryPolicy()
    fields = ("initial_interval", "backoff_factor", "max_interval", "max_attempts", "jitter")
    return {f: getattr(policy, f) for f in fields}


def test_retry_policy_defaults(conform: Conform) -> None:
    conform(retry_policy_defaults)


def failed_step_resumes_without_rerunning_sibling(impl: Impl) -> Any:
    counter = Counter()
    broken = {"on": True}
    done = threading.Event()

    def steady(state: State) -> dict[str, Any]:
        counter.hit("steady")
        done.set()
        return {"log": ["steady"]}

    def fragile(state: State) -> dict[str, Any]:
        # Fail only after the sibling has finished and its result has reached the loop (on a
        # cluster it travels through Redis), so its writes are saved.
        done.wait(1.0)
        time.sleep(0.3)
        counter.hit("fragile")
        if broken["on"]:
            raise Flaky("down")
        return {"log": ["fragile"]}

    b = impl.StateGraph(State)
    b.add_node("steady", steady)
    b.add_node("fragile", fragile)
    b.add_node("join", lambda s: {"n": counter.hit("join")})
    b.add_edge(impl.START, "steady")
    b.add_edge(impl.START, "fragile")
    b.add_edge(["steady", "fragile"], "join")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "fail"}}
    first = collect(g.stream({"log": []}, cfg, stream_mode="updates"))
    after_fail = g.get_state(cfg)
    broken["on"] = False
    second = list(g.stream(None, cfg, stream_mode="updates"))
    return {
        "first": first,
        "next_after_fail": after_fail.next,
        "task_errors": [(t.name, t.error) for t in after_fail.tasks],
        "second": second,
        "final": g.get_state(cfg).values,
        "calls": dict(sorted(counter.calls.items())),
        "history": len(list(g.get_state_history(cfg))),
    }


def test_failed_step_resumes_without_rerunning_sibling(conform: Conform) -> None:
    conform(failed_step_resumes_without_rerunning_sibling)


def empty_input(impl: Impl) -> Any:
    counter = Counter()
    g = _chain(impl, counter, "ab")
    b = impl.StateGraph(State)
    b.add_node("a", lambda s: {"log": ["a"]})
    b.add_edge(impl.START, "a")
    saved = impl.compile(b, checkpointer=impl.saver())
    return {
        "no_saver": attempt(g.invoke, None),
        "fresh_thread": attempt(saved.invoke, None, {"configurable": {"thread_id": "new"}}),
        "no_thread_id": attempt(saved.invoke, {"log": []}),
        "calls": counter.calls,
    }


def test_empty_input(conform: Conform) -> None:
    conform(empty_input)


def node_raises_cancelled_error(impl: Impl) -> Any:
    """A node whose own code raises ``asyncio.CancelledError`` fails the run, naming it."""

    def cancel(state: State) -> dict[str, Any]:
        raise asyncio.CancelledError()

    b = impl.StateGraph(State)
    b.add_node("cancel", cancel)
    b.add_edge(impl.START, "cancel")
    g = impl.compile(b)
    error = attempt(g.invoke, {"log": []})
    return {"error": error, "message": str(error)}


def test_node_raises_cancelled_error(conform: Conform) -> None:
    conform(node_raises_cancelled_error)


def managed_values(impl: Impl) -> Any:
    """``RemainingSteps`` and ``IsLastStep`` state keys: computed, read, never stored."""
    # Built with real annotation objects: this module's annotations are strings.
    keys = {
        "log": Annotated[list[str], operator.add],
        "remaining": impl.managed.RemainingSteps,
        "last": impl.managed.IsLastStep,
    }
    Agent = TypedDict("Agent", keys)  # type: ignore[misc]

    def think(state: Any) -> dict[str, Any]:
        return {"log": [f"{state['remaining']}:{state['last']}"]}

    def enough(state: Any) -> str:
        return impl.END if state["remaining"] <= 2 else "think"

    b = impl.StateGraph(Agent)
    b.add_node("think", think)
    b.add_edge(impl.START, "think")
    b.add_conditional_edges("think", enough)
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "managed"}, "recursion_limit": 6}
    return {"out": g.invoke({"log": []}, cfg), "state": g.get_state(cfg).values}


def test_managed_values(conform: Conform) -> None:
    conform(managed_values)


def step_timeout(impl: Impl) -> Any:
    """``graph.step_timeout``: a step that outruns it fails the run with ``TimeoutError``,
    its running async node cancelled; the finished sibling's writes are kept, so the run
    resumed (without the limit) does not run it again."""
    counter = Counter()
    seen: list[str] = []

    async def quick(state: State) -> dict[str, Any]:
        counter.hit("quick")
        return {"log": ["quick"]}

    async def slow(state: State) -> dict[str, Any]:
        counter.hit("slow")
        try:
            await asyncio.sleep(0.2 if counter.calls["slow"] > 1 else 5)
        except asyncio.CancelledError:
            seen.append("slow cancelled")
            raise
        return {"log": ["slow"]}

    b = impl.StateGraph(State)
    b.add_node("quick", quick)
    b.add_node("slow", slow)
    b.add_edge(impl.START, "quick")
    b.add_edge(impl.START, "slow")
    g = impl.compile(b, checkpointer=impl.saver())
    g.step_timeout = 1.0
    cfg = {"configurable": {"thread_id": "step-timeout"}}
    started = time.monotonic()
    failed = attempt(asyncio.run, g.ainvoke({"log": []}, cfg))
    took = time.monotonic() - started
    g.step_timeout = None
    return {
        "failed": failed,
        "in time": took < 4,
        "next": g.get_state(cfg).next,
        "resumed": asyncio.run(g.ainvoke(None, cfg)),
        "calls": dict(sorted(counter.calls.items())),
        "seen": seen,
    }


def test_step_timeout(conform: Conform) -> None:
    conform(step_timeout)
