"""Subgraphs: as nodes, called from nodes, nested, interrupted, Command.PARENT, state views."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from .harness import Conform, attempt
from .impls import Impl
from .ordering import FinishOrder

pytestmark = pytest.mark.conformance


class Parent(TypedDict):
    log: Annotated[list[str], operator.add]
    topic: str
    answer: str


class Child(TypedDict):
    log: Annotated[list[str], operator.add]
    topic: str
    private: str


class Other(TypedDict):
    text: str
    words: int


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _snapshot(snap: Any) -> dict[str, Any]:
    """What a user reads off a (possibly nested) StateSnapshot."""
    return {
        "values": snap.values,
        "next": snap.next,
        "ns": snap.config["configurable"].get("checkpoint_ns"),
        "interrupts": snap.interrupts,
        "source": snap.metadata["source"],
        "step": snap.metadata["step"],
        "parents": snap.metadata.get("parents"),
        "tasks": [(t.name, t.interrupts, _task_state(t.state)) for t in snap.tasks],
    }


def _task_state(state: Any) -> Any:
    """A task's `state`: a nested snapshot, a config pointing at one, or None."""
    if state is None or isinstance(state, dict):
        return state
    return _snapshot(state)


def _child(impl: Impl, *, interrupting: bool = False, **compile_kw: Any) -> Any:
    """A child graph over `Child`: work → (ask →) done."""

    def work(state: Child) -> dict[str, Any]:
        return {"log": [f"child work on {state['topic']}"], "private": "p"}

    def ask(state: Child) -> dict[str, Any]:
        return {"log": [f"child heard {impl.interrupt('child question?')}"]}

    b = impl.StateGraph(Child)
    b.add_node("work", work)
    b.add_node("done", lambda s: {"log": [f"child done, private={s['private']}"]})
    b.add_edge(impl.START, "work")
    if interrupting:
        b.add_node("ask", ask)
        b.add_edge("work", "ask")
        b.add_edge("ask", "done")
    else:
        b.add_edge("work", "done")
    return impl.compile(b, **compile_kw)


def _parent(impl: Impl, child: Any, **compile_kw: Any) -> Any:
    """A parent over `Parent`: intro → sub (the compiled child) → outro."""
    b = impl.StateGraph(Parent)
    b.add_node("intro", lambda s: {"log": ["intro"]})
    b.add_node("sub", child)
    b.add_node("outro", lambda s: {"answer": f"{len(s['log'])} lines"})
    b.add_edge(impl.START, "intro")
    b.add_edge("intro", "sub")
    b.add_edge("sub", "outro")
    return impl.compile(b, **compile_kw)


def subgraph_node_shared_keys(impl: Impl) -> Any:
    g = _parent(impl, _child(impl), checkpointer=impl.saver())
    cfg = _cfg("shared")
    out = g.invoke({"log": [], "topic": "cats"}, cfg)
    return {
        "invoke": out,
        "updates": list(g.stream({"log": [], "topic": "dogs"}, _cfg("s2"), stream_mode="updates")),
        "state": _snapshot(g.get_state(cfg)),
        "history": len(list(g.get_state_history(cfg))),
    }


def test_subgraph_node_shared_keys(conform: Conform) -> None:
    conform(subgraph_node_shared_keys)


def subgraph_called_in_node(impl: Impl) -> Any:
    cb = impl.StateGraph(Other)
    cb.add_node("count", lambda s: {"words": len(s["text"].split())})
    cb.add_node("shout", lambda s: {"text": s["text"].upper()})
    cb.add_edge(impl.START, "count")
    cb.add_edge("count", "shout")
    child = impl.compile(cb)

    def call_child(state: Parent) -> dict[str, Any]:
        result = child.invoke({"text": state["topic"]})
        return {"answer": f"{result['text']} ({result['words']})", "log": ["called"]}

    b = impl.StateGraph(Parent)
    b.add_node("call_child", call_child)
    b.add_edge(impl.START, "call_child")
    g = impl.compile(b)
    inp = {"log": [], "topic": "two words"}
    return {
        "invoke": g.invoke(inp),
        "streamed": list(g.stream(inp, stream_mode="updates", subgraphs=True)),
    }


def test_subgraph_called_in_node(conform: Conform) -> None:
    conform(subgraph_called_in_node)


def nested_two_levels(impl: Impl) -> Any:
    gb = impl.StateGraph(Child)
    gb.add_node("leaf", lambda s: {"log": ["leaf"], "private": "deep"})
    gb.add_edge(impl.START, "leaf")
    grandchild = impl.compile(gb)

    cb = impl.StateGraph(Child)
    cb.add_node("mid", lambda s: {"log": ["mid"]})
    cb.add_node("grand", grandchild)
    cb.add_edge(impl.START, "mid")
    cb.add_edge("mid", "grand")
    child = impl.compile(cb)

    g = _parent(impl, child)
    inp = {"log": [], "topic": "t"}
    return {
        "updates": list(g.stream(inp, stream_mode="updates", subgraphs=True)),
        "values": list(g.stream(inp, stream_mode=["values"], subgraphs=True)),
        "invoke": g.invoke(inp),
    }


def test_nested_two_levels(conform: Conform) -> None:
    conform(nested_two_levels)


def interrupt_inside_subgraph(impl: Impl) -> Any:
    g = _parent(impl, _child(impl, interrupting=True), checkpointer=impl.saver())
    cfg = _cfg("sub-int")
    first = list(g.stream({"log": [], "topic": "x"}, cfg, stream_mode="updates", subgraphs=True))
    flat = _snapshot(g.get_state(cfg))
    nested = _snapshot(g.get_state(cfg, subgraphs=True))
    resumed = list(g.stream(impl.Command(resume="yes"), cfg, stream_mode="updates", subgraphs=True))
    return {
        "first": first,
        "flat": flat,
        "nested": nested,
        "resumed": resumed,
        "final": _snapshot(g.get_state(cfg)),
    }


def test_interrupt_inside_subgraph(conform: Conform) -> None:
    conform(interrupt_inside_subgraph)


def command_parent(impl: Impl) -> Any:
    def escalate(state: Child) -> Any:
        return impl.Command(
            graph=impl.Command.PARENT, goto="handler", update={"answer": "escalated"}
        )

    cb = impl.StateGraph(Child)
    cb.add_node("work", lambda s: {"log": ["child work"]})
    cb.add_node("escalate", escalate)
    cb.add_node("never", lambda s: {"log": ["child never"]})
    cb.add_edge(impl.START, "work")
    cb.add_edge("work", "escalate")
    cb.add_edge("escalate", "never")
    child = impl.compile(cb)

    # handler and static_next run in one step; updates come in finishing order, so fix it.
    order = [FinishOrder(["handler", "static_next"])]

    def handler(s: Parent) -> dict[str, Any]:
        order[0].run("handler")
        return {"log": [f"handler sees {s['answer']}"]}

    def static_next(s: Parent) -> dict[str, Any]:
        order[0].run("static_next")
        return {"log": ["static next"]}

    b = impl.StateGraph(Parent)
    b.add_node("sub", child, destinations=("handler",))
    b.add_node("handler", handler)
    b.add_node("static_next", static_next)
    b.add_edge(impl.START, "sub")
    b.add_edge("sub", "static_next")
    g = impl.compile(b)
    inp = {"log": [], "topic": "t"}
    invoked = g.invoke(inp)
    order[0] = FinishOrder(["handler", "static_next"])
    return {
        "invoke": invoked,
        "updates": list(g.stream(inp, stream_mode="updates", subgraphs=True)),
    }


def test_command_parent(conform: Conform) -> None:
    conform(command_parent)


def subgraph_called_twice(impl: Impl) -> Any:
    child = _child(impl)

    def twice(state: Parent) -> dict[str, Any]:
        one = child.invoke({"log": [], "topic": "first"})
        two = child.invoke({"log": [], "topic": "second"})
        return {"log": one["log"] + two["log"]}

    b = impl.StateGraph(Parent)
    b.add_node("twice", twice)
    b.add_edge(impl.START, "twice")
    g = impl.compile(b)
    return {"updates": list(g.stream({"log": []}, stream_mode="updates", subgraphs=True))}


def test_subgraph_called_twice(conform: Conform) -> None:
    conform(subgraph_called_twice)


def subgraph_state_history(impl: Impl) -> Any:
    saver = impl.saver()
    g = _parent(impl, _child(impl, interrupting=True), checkpointer=saver)
    cfg = _cfg("sub-hist")
    g.invoke({"log": [], "topic": "h"}, cfg)
    sub_cfg = g.get_state(cfg).tasks[0].state
    child_history = [
        (s.metadata["source"], s.metadata["step"], s.next) for s in g.get_state_history(sub_cfg)
    ]
    g.invoke(impl.Command(resume="ok"), cfg)
    namespaces = sorted(
        {c.config["configurable"]["checkpoint_ns"].split(":")[0] for c in saver.list(None)}
    )
    return {
        "sub_cfg": sub_cfg,
        "child_state": _snapshot(g.get_state(sub_cfg)),
        "child_history": child_history,
        "parent_history": [
            (s.metadata["source"], s.metadata["step"], s.next) for s in g.get_state_history(cfg)
        ],
        "stored_namespaces": namespaces,
    }


def test_subgraph_state_history(conform: Conform) -> None:
    conform(subgraph_state_history)


def subgraph_tasks_point_at_their_checkpoints(impl: Impl) -> Any:
    """A subgraph node's task, in history and in the debug stream's checkpoints as in
    ``get_state``, points at the subgraph's checkpoints (a config, not read)."""

    def pointer(state: Any) -> Any:
        if not isinstance(state, dict):
            return state
        conf = state["configurable"]
        return conf["thread_id"], [p.split(":")[0] for p in conf["checkpoint_ns"].split("|")]

    out = {}
    for persistent in (False, True):
        child = _child(impl, interrupting=True, checkpointer=persistent or None)
        g = _parent(impl, child, checkpointer=impl.saver())
        cfg = _cfg(f"pointers-{persistent}")
        debug = [
            [(t["name"], pointer(t["state"])) for t in part["payload"]["tasks"]]
            for part in g.stream({"log": [], "topic": "p"}, cfg, stream_mode="debug")
            if part["type"] == "checkpoint"
        ]
        history = [[(t.name, pointer(t.state)) for t in s.tasks] for s in g.get_state_history(cfg)]
        out["persistent" if persistent else "plain"] = {"debug": debug, "history": history}
    return out


def test_subgraph_tasks_point_at_their_checkpoints(conform: Conform) -> None:
    conform(subgraph_tasks_point_at_their_checkpoints)


def subgraph_entered_again_after_a_resume(impl: Impl) -> Any:
    """Only the step a run resumes in resumes its subgraphs: a persistent subgraph that a
    later step of the resumed run enters again starts on its new input and asks again."""
    asked: list[str] = []

    def ask(state: Child) -> dict[str, Any]:
        asked.append(state["topic"])
        return {"log": [f"heard {impl.interrupt('again?')}"]}

    cb = impl.StateGraph(Child)
    cb.add_node("ask", ask)
    cb.add_edge(impl.START, "ask")
    child = impl.compile(cb, checkpointer=True)

    def call_child(state: Parent) -> dict[str, Any]:
        out = child.invoke({"log": [], "topic": f"round {len(state['log'])}"})
        return {"log": [out["log"][-1]]}

    def loop(state: Parent) -> Any:
        return impl.Command(goto="call_child") if len(state["log"]) < 2 else {"answer": "done"}

    b = impl.StateGraph(Parent)
    b.add_node("call_child", call_child)
    b.add_node("loop", loop)
    b.add_edge(impl.START, "call_child")
    b.add_edge("call_child", "loop")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("enter-again")
    outputs = [g.invoke({"log": [], "topic": "t"}, cfg)]
    outputs += [g.invoke(impl.Command(resume=answer), cfg) for answer in ("one", "two")]
    return {"outputs": outputs, "asked": asked}


def test_subgraph_entered_again_after_a_resume(conform: Conform) -> None:
    conform(subgraph_entered_again_after_a_resume)


def namespaces_without_a_declared_subgraph(impl: Impl) -> Any:
    """A namespace whose graph the parent cannot find (a node invoking it from a dict) is
    read with the parent's channels, and an update to it is refused; an update to a
    declared subgraph's namespace is applied as that subgraph's node."""
    hidden = {"child": _child(impl)}

    def call_hidden(state: Parent) -> dict[str, Any]:
        hidden["child"].invoke({"log": [], "topic": state["topic"]})
        return {"log": ["called"]}

    b = impl.StateGraph(Parent)
    b.add_node("call_hidden", call_hidden)
    b.add_node("sub", _child(impl, interrupting=True))
    b.add_edge(impl.START, "call_hidden")
    b.add_edge("call_hidden", "sub")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("undeclared")
    namespaces = {
        ns[0].split(":")[0]: {"configurable": {"thread_id": "undeclared", "checkpoint_ns": ns[0]}}
        for ns, _ in g.stream({"log": [], "topic": "t"}, cfg, subgraphs=True)
        if ns
    }
    hidden_cfg, sub_cfg = namespaces["call_hidden"], g.get_state(cfg).tasks[0].state
    updated = g.update_state(sub_cfg, {"log": ["edited"]}, as_node="work")
    return {
        "hidden": g.get_state(hidden_cfg).values,
        "update_hidden": attempt(g.update_state, hidden_cfg, {"log": ["x"]}),
        "sub_after_update": _snapshot(g.get_state(updated))["next"],
    }


def test_namespaces_without_a_declared_subgraph(conform: Conform) -> None:
    conform(namespaces_without_a_declared_subgraph)


def subgraph_breakpoint_resumed_from_parent(impl: Impl) -> Any:
    """A subgraph compiled with ``interrupt_before`` pauses the parent; resuming goes on."""
    cb = impl.StateGraph(Child)
    cb.add_node("draft", lambda s: {"log": ["draft"]})
    cb.add_node("publish", lambda s: {"log": ["publish"]})
    cb.add_edge(impl.START, "draft")
    cb.add_edge("draft", "publish")
    child = impl.compile(cb, interrupt_before=["publish"])
    b = impl.StateGraph(Parent)
    b.add_node("child", child)
    b.add_node("after", lambda s: {"log": ["after"]})
    b.add_edge(impl.START, "child")
    b.add_edge("child", "after")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "breakpoint"}}
    first = list(g.stream({"log": [], "topic": "t"}, cfg, stream_mode="updates"))
    paused = g.get_state(cfg, subgraphs=True)
    resumed = g.invoke(None, cfg)
    return {
        "first": first,
        "paused": (paused.next, [(t.name, t.state.next) for t in paused.tasks]),
        "resumed": resumed,
        "final_next": g.get_state(cfg).next,
    }


def test_subgraph_breakpoint_resumed_from_parent(conform: Conform) -> None:
    conform(subgraph_breakpoint_resumed_from_parent)


def invoke_with_subgraphs_flag(impl: Impl) -> Any:
    """``invoke(..., subgraphs=True)`` returns the output as without the flag."""
    cb = impl.StateGraph(Child)
    cb.add_node("work", lambda s: {"log": ["work"]})
    cb.add_edge(impl.START, "work")
    b = impl.StateGraph(Parent)
    b.add_node("child", impl.compile(cb))
    b.add_edge(impl.START, "child")
    g = impl.compile(b)
    return g.invoke({"log": [], "topic": "t"}, subgraphs=True)


def test_invoke_with_subgraphs_flag(conform: Conform) -> None:
    conform(invoke_with_subgraphs_flag)


def parent_command_from_second_invoked_subgraph(impl: Impl) -> Any:
    """``Command.PARENT`` from the second graph a node invokes reaches that node's graph."""
    cb = impl.StateGraph(Other)

    def maybe_jump(state: Other) -> Any:
        if state["text"] == "jump":
            return impl.Command(graph=impl.Command.PARENT, goto="second")
        return {"text": state["text"]}

    cb.add_node("node", maybe_jump)
    cb.add_edge(impl.START, "node")
    first, again = impl.compile(cb), impl.compile(cb)

    def call_children(state: Parent) -> Any:  # Any: may route (bulksync's reachability)
        first.invoke({"text": "jump" if state["topic"] == "first" else "stay"})
        again.invoke({"text": "jump" if state["topic"] == "again" else "stay"})
        return {"log": ["no jump"]}

    b = impl.StateGraph(Parent)
    b.add_node("call_children", call_children)
    b.add_node("second", lambda s: {"log": ["second"]})
    b.add_edge(impl.START, "call_children")
    g = impl.compile(b)
    return {topic: g.invoke({"log": [], "topic": topic}) for topic in ("first", "again", "none")}


def test_parent_command_from_second_invoked_subgraph(conform: Conform) -> None:
    conform(parent_command_from_second_invoked_subgraph)


def parent_command_three_levels_with_persistent_subgraphs(impl: Impl) -> Any:
    """``Command.PARENT`` from a grandchild lands in its parent, also when the subgraphs
    keep their own checkpoints (``checkpointer=True``: namespaces stored by node name)."""
    out = {}
    for persist in (True, False):
        gb = impl.StateGraph(Parent)
        gb.add_node(
            "jump",
            lambda s: impl.Command(graph=impl.Command.PARENT, goto="after", update={"log": ["g"]}),
        )
        gb.add_edge(impl.START, "jump")
        cb = impl.StateGraph(Parent)
        cb.add_node("first", lambda s: {"log": ["c"]})
        cb.add_node("grand", impl.compile(gb, checkpointer=persist), destinations=("after",))
        cb.add_node("after", lambda s: {"log": ["after"]})
        cb.add_edge(impl.START, "first")
        cb.add_edge("first", "grand")
        b = impl.StateGraph(Parent)
        b.add_node("child", impl.compile(cb, checkpointer=persist))
        b.add_edge(impl.START, "child")
        g = impl.compile(b, checkpointer=impl.saver())
        out[str(persist)] = g.invoke(
            {"log": ["in"]}, {"configurable": {"thread_id": f"deep-{persist}"}}
        )
    return out


def test_parent_command_three_levels_with_persistent_subgraphs(conform: Conform) -> None:
    conform(parent_command_three_levels_with_persistent_subgraphs)


def replay_into_a_subgraph(impl: Impl) -> Any:
    """Replaying the parent from before a subgraph asked its question asks it again; the
    subgraph starts from its own state as of that point, not from its latest."""

    def ask(state: Child) -> dict[str, Any]:
        return {"log": [f"answer:{impl.interrupt('question?')}"]}

    cb = impl.StateGraph(Child)
    cb.add_node("prepare", lambda s: {"log": ["prepared"]})
    cb.add_node("ask", ask)
    cb.add_edge(impl.START, "prepare")
    cb.add_edge("prepare", "ask")
    b = impl.StateGraph(Parent)
    b.add_node("route", lambda s: {"log": ["routed"]})
    b.add_node("child", impl.compile(cb, checkpointer=True))
    b.add_node("after", lambda s: {"log": ["after"]})
    b.add_edge(impl.START, "route")
    b.add_edge("route", "child")
    b.add_edge("child", "after")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "replay-sub"}}
    g.invoke({"log": [], "topic": "t"}, cfg)
    done = g.invoke(impl.Command(resume="first"), cfg)
    history = list(g.get_state_history(cfg))
    before_child = [s for s in history if s.next == ("child",)][-1]
    replayed = g.invoke(None, before_child.config)
    again = g.invoke(impl.Command(resume="second"), cfg)
    return {
        "done": done,
        "replayed": [i.value for i in replayed.get("__interrupt__", ())],
        "again": again,
    }


def test_replay_into_a_subgraph(conform: Conform) -> None:
    conform(replay_into_a_subgraph)


def persistent_subgraph_streams_under_its_name(impl: Impl) -> Any:
    """A ``checkpointer=True`` subgraph keeps one history across calls and streams under its
    node's name alone (no task id), each of the two times the parent loops through it."""

    def step(state: Child) -> dict[str, Any]:
        return {"log": ["child"]}

    cb = impl.StateGraph(Child)
    cb.add_node("step", step)
    cb.add_edge(impl.START, "step")
    b = impl.StateGraph(Child)
    b.add_node("inner", impl.compile(cb, checkpointer=True))
    b.add_edge(impl.START, "inner")
    b.add_conditional_edges("inner", lambda s: "inner" if len(s["log"]) < 2 else impl.END)
    graph = impl.compile(b, checkpointer=impl.saver())
    thread = {"configurable": {"thread_id": "persistent"}}
    return list(graph.stream({"log": []}, thread, subgraphs=True))


def test_persistent_subgraph_streams_under_its_name(conform: Conform) -> None:
    conform(persistent_subgraph_streams_under_its_name)


def _paused_in_an_invoked_graph(impl: Impl, persistent: bool | None) -> Any:
    def ask(state: Child) -> dict[str, Any]:
        return {"private": impl.interrupt("why?")}

    cb = impl.StateGraph(Child)
    cb.add_node("ask", ask)
    cb.add_edge(impl.START, "ask")
    sub = impl.compile(cb, checkpointer=persistent)

    def calls_it(state: Parent) -> dict[str, Any]:
        result = sub.invoke({"log": [], "topic": state["topic"], "private": ""})
        return {"answer": result["private"]}

    b = impl.StateGraph(Parent)
    b.add_node("calls_it", calls_it)
    b.add_edge(impl.START, "calls_it")
    graph = impl.compile(b, checkpointer=impl.saver())
    thread = _cfg(f"invoked-{persistent}")
    graph.invoke({"log": [], "topic": "t", "answer": ""}, thread)
    state = graph.get_state(thread, subgraphs=True)
    child = state.tasks[0].state
    return {
        "next": state.next,
        "child": None if child is None else (child.values, child.next),
        "resumed": graph.invoke(impl.Command(resume="because"), thread),
    }


def state_of_a_graph_invoked_in_a_node(impl: Impl) -> Any:
    """``get_state(subgraphs=True)`` shows the paused state of a graph a node invokes in its
    function (persistent or not), found by reading the function."""
    return {str(p): _paused_in_an_invoked_graph(impl, p) for p in (True, None)}


def test_state_of_a_graph_invoked_in_a_node(conform: Conform) -> None:
    conform(state_of_a_graph_invoked_in_a_node)


def invoked_graph_resumes_where_it_paused(impl: Impl) -> Any:
    """A graph a node invokes checkpoints with the run's saver wherever the node runs: on
    resume its steps before the interrupt do not run again, its history is kept, and its
    update through the parent's namespace lands."""
    ran: list[str] = []

    def prepare(state: Child) -> dict[str, Any]:
        ran.append("prepare")
        return {"log": ["prepared"]}

    def ask(state: Child) -> dict[str, Any]:
        ran.append("ask")
        return {"log": [f"answer:{impl.interrupt('why?')}"]}

    cb = impl.StateGraph(Child)
    cb.add_node("prepare", prepare)
    cb.add_node("ask", ask)
    cb.add_edge(impl.START, "prepare")
    cb.add_edge("prepare", "ask")
    sub = impl.compile(cb)

    def calls_it(state: Parent) -> dict[str, Any]:
        result = sub.invoke({"log": [], "topic": state["topic"]})
        return {"log": result["log"]}

    b = impl.StateGraph(Parent)
    b.add_node("calls_it", calls_it)
    b.add_edge(impl.START, "calls_it")
    graph = impl.compile(b, checkpointer=impl.saver())
    thread = _cfg("invoked-resumes")
    graph.invoke({"log": [], "topic": "t"}, thread)
    paused = list(ran)
    child = graph.get_state(thread, subgraphs=True).tasks[0].state
    history = [s.next for s in graph.get_state_history(child.config)]
    done = graph.invoke(impl.Command(resume="because"), thread)
    return {"paused": paused, "ran": ran, "history": history, "done": done}


def test_invoked_graph_resumes_where_it_paused(conform: Conform) -> None:
    conform(invoked_graph_resumes_where_it_paused)


def time_travel_to_a_subgraph_checkpoint(impl: Impl) -> Any:
    """Invoking the parent with a subgraph's own checkpoint (from ``get_state(subgraphs=True)``)
    goes on from exactly there: the question asked at that checkpoint is asked again, steps
    before it do not run again; a fork of that checkpoint (``update_state``) too."""
    ran: list[str] = []

    def step(state: Child) -> dict[str, Any]:
        ran.append("step")
        return {"log": ["step"]}

    def ask(name: str) -> Any:
        def node(state: Child) -> dict[str, Any]:
            ran.append(name)
            return {"log": [f"{name}:{impl.interrupt(name + '?')}"]}

        return node

    cb = impl.StateGraph(Child)
    cb.add_node("step", step)
    cb.add_node("first", ask("first"))
    cb.add_node("second", ask("second"))
    cb.add_edge(impl.START, "step")
    cb.add_edge("step", "first")
    cb.add_edge("first", "second")
    b = impl.StateGraph(Parent)
    b.add_node("child", impl.compile(cb, checkpointer=True))
    b.add_edge(impl.START, "child")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("into-sub")
    g.invoke({"log": [], "topic": "t"}, cfg)
    at_first = g.get_state(cfg, subgraphs=True).tasks[0].state.config
    g.invoke(impl.Command(resume="a1"), cfg)
    done = g.invoke(impl.Command(resume="a2"), cfg)
    ran.clear()
    replayed = g.invoke(None, at_first)
    replay_ran = list(ran)
    ran.clear()
    fork = g.update_state(at_first, {"log": ["forked"]})
    forked = g.invoke(None, fork)
    return {
        "done": done,
        "replayed": ([i.value for i in replayed.get("__interrupt__", ())], replay_ran),
        "forked": ([i.value for i in forked.get("__interrupt__", ())], list(ran)),
        "then": g.invoke(impl.Command(resume="b1"), cfg),
    }


def test_time_travel_to_a_subgraph_checkpoint(conform: Conform) -> None:
    conform(time_travel_to_a_subgraph_checkpoint)
