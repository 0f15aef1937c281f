"""History and time travel: get_state_history, filters, replay, forks, durability modes."""

from __future__ import annotations

import operator
import threading
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform, attempt
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    note: str


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


class Calls:
    """Records node calls in order, thread-safely."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.lock = threading.Lock()

    def node(self, name: str) -> Any:
        """A node appending `name` to the log and recording its call."""

        def run(state: State) -> dict[str, Any]:
            with self.lock:
                self.names.append(name)
            return {"log": [name]}

        return run


def _abc(impl: Impl, calls: Calls, **compile_kw: Any) -> Any:
    """START → a → b → c, checkpointed in memory."""
    b = impl.StateGraph(State)
    for name in "abc":
        b.add_node(name, calls.node(name))
    b.add_edge(impl.START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    return impl.compile(b, checkpointer=impl.saver(), **compile_kw)


def _entry(snap: Any) -> dict[str, Any]:
    """One history entry as a user reads it."""
    return {
        "id": snap.config["configurable"]["checkpoint_id"],
        "parent": (snap.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
        "source": snap.metadata["source"],
        "step": snap.metadata["step"],
        "next": snap.next,
        "values": snap.values,
        "tasks": [(t.name, t.result) for t in snap.tasks],
    }


def history_after_run(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls)
    cfg = _cfg("hist")
    g.invoke({"log": ["one"]}, cfg)
    first = [_entry(s) for s in g.get_state_history(cfg)]
    g.invoke({"log": ["two"]}, cfg)
    second = [_entry(s) for s in g.get_state_history(cfg)]
    return {"first": first, "second_len": len(second), "second_head": second[:5]}


def test_history_after_run(conform: Conform) -> None:
    conform(history_after_run)


def history_filter_before_limit(impl: Impl) -> Any:
    g = _abc(impl, Calls())
    cfg = _cfg("filter")
    g.invoke({"log": []}, cfg)
    g.invoke({"log": ["again"]}, cfg)
    everything = list(g.get_state_history(cfg))
    pivot = everything[3].config

    def steps(**kw: Any) -> list[Any]:
        return [(s.metadata["source"], s.metadata["step"]) for s in g.get_state_history(cfg, **kw)]

    return {
        "all": steps(),
        "inputs": steps(filter={"source": "input"}),
        "step_1": steps(filter={"step": 1}),
        "both": steps(filter={"source": "loop", "step": 3}),
        "limit": steps(limit=2),
        "before": steps(before=pivot),
        "before_limit": steps(before=pivot, limit=3),
        "pivot": pivot,
    }


def test_history_filter_before_limit(conform: Conform) -> None:
    conform(history_filter_before_limit)


def replay_from_checkpoint(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls)
    cfg = _cfg("replay")
    g.invoke({"log": []}, cfg)
    before_b = next(s for s in g.get_state_history(cfg) if s.next == ("b",))
    calls.names.clear()
    replayed = list(g.stream(None, before_b.config, stream_mode="updates"))
    history = [_entry(s) for s in g.get_state_history(cfg)]
    return {
        "replayed": replayed,
        "calls": calls.names,
        "history": [(h["source"], h["step"], h["next"]) for h in history],
        "fork_parent_is_replayed": history[2]["parent"]
        == before_b.config["configurable"]["checkpoint_id"],
        "latest": g.get_state(cfg).values,
        "old_checkpoint": _entry(g.get_state(before_b.config)),
    }


def test_replay_from_checkpoint(conform: Conform) -> None:
    conform(replay_from_checkpoint)


def fork_via_update_state(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls)
    cfg = _cfg("fork")
    g.invoke({"log": []}, cfg)
    after_a = next(s for s in g.get_state_history(cfg) if s.next == ("b",))
    fork_cfg = g.update_state(after_a.config, {"note": "forked"}, as_node="a")
    forked = _entry(g.get_state(fork_cfg))
    calls.names.clear()
    result = g.invoke(None, fork_cfg)
    history = [(s.metadata["source"], s.metadata["step"]) for s in g.get_state_history(cfg)]
    return {
        "forked": forked,
        "forked_parent_is_old": forked["parent"] == after_a.config["configurable"]["checkpoint_id"],
        "result": result,
        "calls": calls.names,
        "history": history,
    }


def test_fork_via_update_state(conform: Conform) -> None:
    conform(fork_via_update_state)


def durability_modes(impl: Impl) -> Any:
    out: dict[str, Any] = {}
    for mode in ("sync", "async", "exit"):
        g = _abc(impl, Calls())
        cfg = _cfg(mode)
        result = g.invoke({"log": []}, cfg, durability=mode)
        history = [(s.metadata["source"], s.metadata["step"]) for s in g.get_state_history(cfg)]
        out[mode] = {"result": result, "history": history, "next": g.get_state(cfg).next}
    return out


def test_durability_modes(conform: Conform) -> None:
    conform(durability_modes)


def durability_exit_parents(impl: Impl) -> Any:
    """Under ``durability="exit"`` a run stores one checkpoint, whose parent is the one the
    thread held before the run (none on a new thread), not a step never stored."""
    g = _abc(impl, Calls())
    cfg = _cfg("exit-parents")
    g.invoke({"log": ["one"]}, cfg, durability="exit")
    g.invoke({"log": ["two"]}, cfg, durability="exit")
    return [_entry(s) for s in g.get_state_history(cfg)]


def test_durability_exit_parents(conform: Conform) -> None:
    conform(durability_exit_parents)


def durability_exit_with_interrupt(impl: Impl) -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"note": impl.interrupt("note?")}

    b = impl.StateGraph(State)
    b.add_node("a", lambda s: {"log": ["a"]})
    b.add_node("ask", ask)
    b.add_edge(impl.START, "a")
    b.add_edge("a", "ask")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("exit-int")
    first = g.invoke({"log": []}, cfg, durability="exit")
    paused = [(s.metadata["source"], s.metadata["step"], s.next) for s in g.get_state_history(cfg)]
    interrupts = g.get_state(cfg).interrupts
    final = g.invoke(impl.Command(resume="n"), cfg, durability="exit")
    done = [(s.metadata["source"], s.metadata["step"], s.next) for s in g.get_state_history(cfg)]
    return {
        "first": first,
        "paused": paused,
        "interrupts": interrupts,
        "final": final,
        "done": done,
    }


def test_durability_exit_with_interrupt(conform: Conform) -> None:
    conform(durability_exit_with_interrupt)


def get_state_at_checkpoint(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls)
    cfg = _cfg("at")
    g.invoke({"log": []}, cfg)
    views = {}
    for snap in g.get_state_history(cfg):
        again = g.get_state(snap.config)
        views[snap.metadata["step"]] = {
            "same_values": again.values == snap.values,
            "same_next": again.next == snap.next,
            "entry": _entry(again),
        }
    unknown = {"configurable": {"thread_id": "at", "checkpoint_id": "no-such-checkpoint"}}
    missing = attempt(g.get_state, unknown)
    return {
        "views": views,
        "unknown_checkpoint": missing if isinstance(missing, Exception) else missing.values,
        "other_thread": g.get_state(_cfg("nobody")).values,
        "other_thread_history": len(list(g.get_state_history(_cfg("nobody")))),
    }


def test_get_state_at_checkpoint(conform: Conform) -> None:
    conform(get_state_at_checkpoint)


def async_state_api(impl: Impl) -> Any:
    """aget_state, aget_state_history, aupdate_state, ainvoke and astream."""
    import asyncio

    graph = _abc(impl, Calls())
    cfg = _cfg("async")

    async def drive() -> dict[str, Any]:
        out = await graph.ainvoke({"log": []}, cfg)
        state = await graph.aget_state(cfg)
        history = [_entry(s) async for s in graph.aget_state_history(cfg)]
        updated = await graph.aupdate_state(cfg, {"note": "n"}, as_node="b")
        after = await graph.aget_state(updated)
        again = [c async for c in graph.astream(None, updated, stream_mode="updates")]
        return {
            "out": out,
            "state": (state.values, state.next),
            "history": history,
            "after": (after.values, after.next, after.metadata["source"]),
            "again": again,
        }

    return asyncio.run(drive())


def test_async_state_api(conform: Conform) -> None:
    conform(async_state_api)


def bulk_update_state(impl: Impl) -> Any:
    """Several supersteps of updates, one checkpoint each; several nodes in one superstep."""
    graph = _abc(impl, Calls())
    cfg = _cfg("bulk")
    graph.invoke({"log": []}, cfg)
    last = graph.bulk_update_state(
        cfg,
        [
            [({"log": ["from a"]}, "a", None), ({"log": ["from b"], "note": "x"}, "b", None)],
            [({"log": ["from c"]}, "c", None)],
        ],
    )
    errors = [
        attempt(graph.bulk_update_state, cfg, []),
        attempt(graph.bulk_update_state, cfg, [[]]),
        attempt(graph.bulk_update_state, cfg, [[(None, "__copy__", None)] * 2]),
        attempt(graph.bulk_update_state, cfg, [[({"log": []}, "__input__", None)] * 2]),
    ]
    return {
        "history": [_entry(s) for s in graph.get_state_history(cfg)][:3],
        "last": graph.get_state(last).values,
        "errors": [(type(e).__name__, str(e)) for e in errors],
    }


def test_bulk_update_state(conform: Conform) -> None:
    conform(bulk_update_state)
