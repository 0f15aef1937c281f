"""Commands: goto/update/Send from nodes, Command input, multiple writes, Overwrite, END."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform, attempt, collect
from .impls import Impl

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    last: str


def _mark(tag: str) -> Any:
    """A node appending `tag` to the log and recording it as `last`."""
    return lambda s: {"log": [tag], "last": tag}


def _log(tag: str) -> Any:
    """A node appending `tag` to the log only."""
    return lambda s: {"log": [tag]}


def command_goto_update(impl: Impl) -> Any:
    def router(state: State) -> Any:
        target = "yes" if state["last"] == "go" else "no"
        return impl.Command(update={"log": [f"router->{target}"], "last": "routed"}, goto=target)

    b = impl.StateGraph(State)
    b.add_node("router", router, destinations=("yes", "no"))
    b.add_node("yes", _mark("yes"))
    b.add_node("no", _mark("no"))
    b.add_edge(impl.START, "router")
    g = impl.compile(b)
    return {
        "go": list(g.stream({"log": [], "last": "go"}, stream_mode="updates")),
        "stop": g.invoke({"log": [], "last": "stop"}),
    }


def test_command_goto_update(conform: Conform) -> None:
    conform(command_goto_update)


def command_goto_sends(impl: Impl) -> Any:
    def scatter(state: State) -> Any:
        goto = [impl.Send("worker", f"job{i}") for i in range(3)] + ["audit"]
        return impl.Command(update={"log": ["scatter"]}, goto=goto)

    b = impl.StateGraph(State)
    b.add_node("scatter", scatter)
    b.add_node("worker", lambda job: {"log": [f"did {job}"]})
    b.add_node("audit", lambda s: {"last": f"audit saw {len(s['log'])}"})
    b.add_edge(impl.START, "scatter")
    g = impl.compile(b)
    return {"values": list(g.stream({"log": []}, stream_mode="values"))}


def test_command_goto_sends(conform: Conform) -> None:
    conform(command_goto_sends)


def command_single_send(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("one", lambda s: impl.Command(goto=impl.Send("two", {"x": 1})))
    b.add_node("two", lambda arg: {"log": [f"two got {arg['x']}"]})
    b.add_edge(impl.START, "one")
    g = impl.compile(b)
    return {"invoke": g.invoke({"log": []}), "updates": list(g.stream({"log": []}))}


def test_command_single_send(conform: Conform) -> None:
    conform(command_single_send)


def command_list_update_twice(impl: Impl) -> Any:
    def twice(state: State) -> Any:
        return impl.Command(update=[("log", ["first"]), ("log", ["second"])])

    def twice_plain(state: State) -> Any:
        return impl.Command(update=[("last", "first"), ("last", "second")])

    b = impl.StateGraph(State)
    b.add_node("twice", twice)
    b.add_edge(impl.START, "twice")
    g = impl.compile(b)
    c = impl.StateGraph(State)
    c.add_node("twice_plain", twice_plain)
    c.add_edge(impl.START, "twice_plain")
    h = impl.compile(c)
    return {
        "reducer": list(g.stream({"log": []}, stream_mode=["updates", "values"])),
        "last_value": collect(h.stream({"log": []}, stream_mode="updates")),
    }


def test_command_list_update_twice(conform: Conform) -> None:
    conform(command_list_update_twice)


def overwrite(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("seed", _log("seed"))
    b.add_node("keep", _log("keep"))
    b.add_node("reset", lambda s: {"log": impl.Overwrite(["reset"])})
    b.add_node("zlast", _log("zlast"))
    b.add_edge(impl.START, "seed")
    for name in ("keep", "reset", "zlast"):
        b.add_edge("seed", name)
    g = impl.compile(b)
    chunks = list(g.stream({"log": []}, stream_mode="updates"))
    # parallel tasks stream in completion order: compare them keyed by node instead
    by_node = {name: upd for chunk in chunks for name, upd in sorted(chunk.items())}
    return {
        "invoke": g.invoke({"log": ["input"]}),
        "updates": dict(sorted(by_node.items())),
        "chunks": len(chunks),
    }


def test_overwrite(conform: Conform) -> None:
    conform(overwrite)


def overwrite_via_command(impl: Impl) -> Any:
    def wipe(state: State) -> Any:
        return impl.Command(update={"log": impl.Overwrite([f"wiped {len(state['log'])}"])})

    b = impl.StateGraph(State)
    b.add_node("grow", _mark("grow"))
    b.add_node("wipe", wipe)
    b.add_node("after", _mark("after"))
    b.add_edge(impl.START, "grow")
    b.add_edge("grow", "wipe")
    b.add_edge("wipe", "after")
    g = impl.compile(b)
    return {"values": list(g.stream({"log": ["a", "b"]}, stream_mode="values"))}


def test_overwrite_via_command(conform: Conform) -> None:
    conform(overwrite_via_command)


def double_overwrite(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("one", lambda s: {"log": impl.Overwrite(["one"])})
    b.add_node("two", lambda s: {"log": impl.Overwrite(["two"])})
    b.add_edge(impl.START, "one")
    b.add_edge(impl.START, "two")
    g = impl.compile(b)
    return {"stream": collect(g.stream({"log": []}, stream_mode="values"))}


def test_double_overwrite(conform: Conform) -> None:
    conform(double_overwrite)


def double_write_invalid_update(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("left", _mark("left"))
    b.add_node("right", _mark("right"))
    b.add_edge(impl.START, "left")
    b.add_edge(impl.START, "right")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "t"}}
    err = attempt(g.invoke, {"log": []}, cfg)
    saved = next(iter(g.get_state_history(cfg)))
    return {
        "error": err,
        "mentions_key": "'last'" in str(err),
        # the live view re-applies the failed step's finished writes, so it fails again
        "live_state": attempt(lambda: g.get_state(cfg).values),
        "saved_values": saved.values,
        "saved_next": saved.next,
        "saved_step": saved.metadata["step"],
    }


def test_double_write_invalid_update(conform: Conform) -> None:
    conform(double_write_invalid_update)


def goto_end_with_static_edge(impl: Impl) -> Any:
    def decide(state: State) -> Any:
        return impl.Command(update={"log": ["decide"]}, goto=impl.END)

    b = impl.StateGraph(State)
    b.add_node("decide", decide, destinations=("next", impl.END))
    b.add_node("next", _mark("next"))
    b.add_edge(impl.START, "decide")
    b.add_edge("decide", "next")
    g = impl.compile(b)
    return {"updates": list(g.stream({"log": []}, stream_mode="updates"))}


def test_goto_end_with_static_edge(conform: Conform) -> None:
    conform(goto_end_with_static_edge)


def command_as_input(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    for name in ("a", "b", "c"):
        b.add_node(name, _mark(name))
    b.add_edge(impl.START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "cmd"}}
    first = g.invoke({"log": ["in"]}, cfg)
    jumped = list(
        g.stream(impl.Command(update={"log": ["cmd"]}, goto="c"), cfg, stream_mode="values")
    )
    history = [s.metadata["source"] for s in g.get_state_history(cfg)]
    return {"first": first, "jumped": jumped, "sources": history}


def test_command_as_input(conform: Conform) -> None:
    conform(command_as_input)


def command_errors(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("a", _mark("a"))
    b.add_edge(impl.START, "a")
    g = impl.compile(b, checkpointer=impl.saver())
    plain = impl.compile(b)
    cfg = {"configurable": {"thread_id": "e"}}
    return {
        "parent_at_root": attempt(g.invoke, impl.Command(graph=impl.Command.PARENT), cfg),
        "resume_without_saver": attempt(plain.invoke, impl.Command(resume="x")),
        # an empty Command() is not observed: LangGraph 1.2.22 fails on it with an
        # UnboundLocalError inside its loop, which is a bug rather than a contract
    }


def test_command_errors(conform: Conform) -> None:
    conform(command_errors)


def mixed_list_return(impl: Impl) -> Any:
    def both(state: State) -> Any:
        return [impl.Command(update={"log": ["cmd"]}, goto="tail"), {"last": "plain"}]

    b = impl.StateGraph(State)
    b.add_node("both", both)
    b.add_node("tail", _mark("tail"))
    b.add_edge(impl.START, "both")
    g = impl.compile(b)
    return {"updates": list(g.stream({"log": []}, stream_mode="updates"))}


def test_mixed_list_return(conform: Conform) -> None:
    conform(mixed_list_return)


def command_on_a_fresh_thread(impl: Impl) -> Any:
    """A Command sent to a thread with no checkpoint runs the graph, as LangGraph does: the
    Command is START's input too (its update applies twice) and its resume answer is lost."""

    class Log(TypedDict):
        log: Annotated[list[str], operator.add]

    def ask(state: Log) -> dict[str, Any]:
        return {"log": [f"ask:{impl.interrupt('q')}"]}

    commands = {
        "resume": impl.Command(resume="x"),
        "update": impl.Command(update={"log": ["u"]}),
        "update_goto": impl.Command(update={"log": ["u"]}, goto="other"),
    }
    seen = {}
    for name, command in commands.items():
        b = impl.StateGraph(Log)
        b.add_node("ask", ask)
        b.add_node("other", lambda s: {"log": ["other"]})
        b.add_edge(impl.START, "ask")
        g = impl.compile(b, checkpointer=impl.saver())
        cfg = {"configurable": {"thread_id": f"fresh-{name}"}}
        out = g.invoke(command, cfg)
        state = g.get_state(cfg)
        seen[name] = (out, state.values, state.next)
    return seen


def test_command_on_a_fresh_thread(conform: Conform) -> None:
    conform(command_on_a_fresh_thread)


def command_list_on_a_root_state(impl: Impl) -> Any:
    """A node of a keyless state returning several Commands: each update applies; the
    ``updates`` stream shows them as a list."""
    b = impl.StateGraph(Annotated[str, operator.add])
    b.add_node("a", lambda s: [impl.Command(update="a1"), impl.Command(update="a2")])
    b.add_node("b", lambda s: "b")
    b.add_edge(impl.START, "a")
    b.add_edge("a", "b")
    graph = impl.compile(b)
    return {"out": graph.invoke(""), "updates": list(graph.stream("", stream_mode="updates"))}


def test_command_list_on_a_root_state(conform: Conform) -> None:
    conform(command_list_on_a_root_state)


def pydantic_command_update_sets_only_given_fields(impl: Impl) -> Any:
    """A Command whose update is a pydantic state instance writes the fields given, not the
    ones left at a None default."""
    from pydantic import BaseModel

    class Model(BaseModel):
        foo: str | None = None
        bar: str | None = None

    b = impl.StateGraph(Model)
    b.add_node("a", lambda s: Model(foo="foo"))
    b.add_node("b", lambda s: impl.Command(update=Model(bar="bar")))
    b.add_node("c", lambda s: impl.Command(update=Model(foo=None)))
    b.add_edge(impl.START, "a")
    b.add_edge("a", "b")
    graph = impl.compile(b)
    c = impl.StateGraph(Model)
    c.add_node("a", lambda s: Model(foo="foo"))
    c.add_node("c", lambda s: impl.Command(update=Model(foo=None)))
    c.add_edge(impl.START, "a")
    c.add_edge("a", "c")
    return {"given": graph.invoke(Model()), "set_to_none": impl.compile(c).invoke(Model())}


def test_pydantic_command_update_sets_only_given_fields(conform: Conform) -> None:
    conform(pydantic_command_update_sets_only_given_fields)
