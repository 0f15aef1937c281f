"""Human in the loop: interrupt()/resume, breakpoints, update_state, state views."""

from __future__ import annotations

import operator
import threading
from typing import Annotated, Any, TypedDict

import pydantic
import pytest

from .harness import Conform, attempt
from .impls import Impl
from .ordering import FinishOrder

pytestmark = pytest.mark.conformance


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    answer: str


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _snapshot(snap: Any) -> dict[str, Any]:
    """The parts of a StateSnapshot a user relies on."""
    return {
        "values": snap.values,
        "next": snap.next,
        "interrupts": snap.interrupts,
        "tasks": [(t.name, t.interrupts, t.error) for t in snap.tasks],
        "source": snap.metadata["source"] if snap.metadata else None,
        "step": snap.metadata["step"] if snap.metadata else None,
    }


class Calls:
    """Records node calls in order, thread-safely."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.lock = threading.Lock()

    def add(self, name: str) -> None:
        """Record one call of `name`."""
        with self.lock:
            self.names.append(name)


def single_interrupt_resume(impl: Impl) -> Any:
    calls = Calls()

    def ask(state: State) -> dict[str, Any]:
        calls.add("ask")
        reply = impl.interrupt({"question": "name?", "seen": len(state["log"])})
        return {"answer": reply, "log": [f"asked got {reply}"]}

    b = impl.StateGraph(State)
    b.add_node("ask", ask)
    b.add_node("greet", lambda s: {"log": [f"hello {s['answer']}"]})
    b.add_edge(impl.START, "ask")
    b.add_edge("ask", "greet")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("one")
    first = g.invoke({"log": ["in"]}, cfg)
    paused = _snapshot(g.get_state(cfg))
    resumed = list(g.stream(impl.Command(resume="Ada"), cfg, stream_mode="updates"))
    return {
        "first": first,
        "paused": paused,
        "resumed": resumed,
        "final": _snapshot(g.get_state(cfg)),
        "calls": calls.names,
    }


def test_single_interrupt_resume(conform: Conform) -> None:
    conform(single_interrupt_resume)


def sequential_interrupts_one_node(impl: Impl) -> Any:
    calls = Calls()

    def form(state: State) -> dict[str, Any]:
        calls.add("form")
        first = impl.interrupt("first?")
        second = impl.interrupt(f"second after {first}?")
        third = impl.interrupt("third?")
        return {"answer": f"{first}/{second}/{third}"}

    b = impl.StateGraph(State)
    b.add_node("form", form)
    b.add_edge(impl.START, "form")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("seq")
    steps = [g.invoke({"log": []}, cfg)]
    for reply in ("x", "y", "z"):
        steps.append(g.invoke(impl.Command(resume=reply), cfg))
    return {
        "steps": steps,
        "calls": calls.names,
        "history": len(list(g.get_state_history(cfg))),
    }


def test_sequential_interrupts_one_node(conform: Conform) -> None:
    conform(sequential_interrupts_one_node)


def _two_askers(impl: Impl, calls: Calls) -> Any:
    """START → left and right in parallel, both interrupting; then join.

    Interrupts are listed in the order their tasks finish, so left always finishes first.
    """
    order = FinishOrder(["left", "right"])

    def asker(name: str) -> Any:
        def node(state: State) -> dict[str, Any]:
            calls.add(name)
            order.run(name)
            return {"log": [f"{name}={impl.interrupt(f'{name}?')}"]}

        return node

    b = impl.StateGraph(State)
    b.add_node("left", asker("left"))
    b.add_node("right", asker("right"))
    b.add_node("join", lambda s: {"answer": ",".join(s["log"])})
    b.add_edge(impl.START, "left")
    b.add_edge(impl.START, "right")
    b.add_edge(["left", "right"], "join")
    return impl.compile(b, checkpointer=impl.saver())


def parallel_interrupts_resume_map(impl: Impl) -> Any:
    calls = Calls()
    g = _two_askers(impl, calls)
    cfg = _cfg("par")
    first = g.invoke({"log": []}, cfg)
    pending = {i.value: i.id for i in g.get_state(cfg).interrupts}
    only_right = g.invoke(impl.Command(resume={pending["right?"]: "R"}), cfg)
    after_one = _snapshot(g.get_state(cfg))
    rest = g.invoke(impl.Command(resume={pending["left?"]: "L"}), cfg)
    return {
        "first": first,
        "pending_values": sorted(pending),
        "only_right": only_right,
        "after_one": after_one,
        "rest": rest,
        "calls": sorted(calls.names),
    }


def test_parallel_interrupts_resume_map(conform: Conform) -> None:
    conform(parallel_interrupts_resume_map)


def parallel_interrupts_resume_all_at_once(impl: Impl) -> Any:
    calls = Calls()
    g = _two_askers(impl, calls)
    cfg = _cfg("all")
    g.invoke({"log": []}, cfg)
    answers = {i.id: i.value.upper() for i in g.get_state(cfg).interrupts}
    return {"final": g.invoke(impl.Command(resume=answers), cfg), "calls": sorted(calls.names)}


def test_parallel_interrupts_resume_all_at_once(conform: Conform) -> None:
    conform(parallel_interrupts_resume_all_at_once)


def single_resume_with_many_pending(impl: Impl) -> Any:
    calls = Calls()
    g = _two_askers(impl, calls)
    cfg = _cfg("many")
    g.invoke({"log": []}, cfg)
    before = len(calls.names)
    err = attempt(g.invoke, impl.Command(resume="same"), cfg)
    return {
        "error": err,
        "reran": len(calls.names) - before,
        "state": _snapshot(g.get_state(cfg)),
    }


def test_single_resume_with_many_pending(conform: Conform) -> None:
    conform(single_resume_with_many_pending)


def _abc(impl: Impl, calls: Calls, **compile_kw: Any) -> Any:
    """START → a → b → c, checkpointed."""
    b = impl.StateGraph(State)
    for name in "abc":

        def node(state: State, name: str = name) -> dict[str, Any]:
            calls.add(name)
            return {"log": [name]}

        b.add_node(name, node)
    b.add_edge(impl.START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    return impl.compile(b, checkpointer=impl.saver(), **compile_kw)


def interrupt_before_at_compile(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls, interrupt_before=["b"])
    cfg = _cfg("before")
    first = list(g.stream({"log": []}, cfg, stream_mode="updates"))
    paused = _snapshot(g.get_state(cfg))
    invoked_again = g.invoke(None, cfg)
    return {
        "first": first,
        "paused": paused,
        "resumed": invoked_again,
        "calls": calls.names,
        "next_run": list(g.stream({"log": ["again"]}, cfg, stream_mode="values")),
    }


def test_interrupt_before_at_compile(conform: Conform) -> None:
    conform(interrupt_before_at_compile)


def interrupt_after_per_call_update_state(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls)
    cfg = _cfg("after")
    first = g.invoke({"log": []}, cfg, interrupt_after=["a"])
    paused = _snapshot(g.get_state(cfg))
    new_cfg = g.update_state(cfg, {"log": ["human"]}, as_node="a")
    updated = _snapshot(g.get_state(cfg))
    rest = list(g.stream(None, cfg, stream_mode="values", interrupt_after=["a"]))
    return {
        "first": first,
        "paused": paused,
        "update_config_keys": sorted(new_cfg["configurable"]),
        "updated": updated,
        "rest": rest,
        "calls": calls.names,
    }


def test_interrupt_after_per_call_update_state(conform: Conform) -> None:
    conform(interrupt_after_per_call_update_state)


def interrupt_star_breakpoints(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls, interrupt_before="*")
    cfg = _cfg("star")
    pauses = [g.invoke({"log": []}, cfg)]
    nexts = [g.get_state(cfg).next]
    for _ in range(4):
        pauses.append(g.invoke(None, cfg))
        nexts.append(g.get_state(cfg).next)
    return {"pauses": pauses, "nexts": nexts, "calls": calls.names}


def test_interrupt_star_breakpoints(conform: Conform) -> None:
    conform(interrupt_star_breakpoints)


def update_state_special_nodes(impl: Impl) -> Any:
    calls = Calls()
    g = _abc(impl, calls, interrupt_before=["b"])
    out: dict[str, Any] = {}

    cfg = _cfg("end")
    g.invoke({"log": []}, cfg)
    g.update_state(cfg, None, as_node=impl.END)
    out["as_end"] = _snapshot(g.get_state(cfg))
    out["as_end_resumed"] = g.invoke(None, cfg)

    cfg = _cfg("input")
    g.invoke({"log": []}, cfg)
    g.update_state(cfg, {"log": ["fresh"]}, as_node="__input__")
    out["as_input"] = _snapshot(g.get_state(cfg))
    out["as_input_resumed"] = g.invoke(None, cfg)

    cfg = _cfg("copy")
    g.invoke({"log": []}, cfg)
    g.update_state(cfg, None, as_node="__copy__")
    out["as_copy"] = _snapshot(g.get_state(cfg))
    out["as_copy_history"] = [s.metadata["source"] for s in g.get_state_history(cfg)]

    cfg = _cfg("infer")
    g.invoke({"log": []}, cfg)
    g.update_state(cfg, {"answer": "inferred"})
    out["inferred"] = _snapshot(g.get_state(cfg))
    out["unknown_node"] = attempt(g.update_state, cfg, {"answer": "x"}, as_node="nope")
    # Sorted: parallel tasks (a and c after the __input__ update) start in no fixed order.
    out["calls"] = sorted(calls.names)
    return out


def test_update_state_special_nodes(conform: Conform) -> None:
    conform(update_state_special_nodes)


def update_state_ambiguous(impl: Impl) -> Any:
    b = impl.StateGraph(State)
    b.add_node("left", lambda s: {"log": ["left"]})
    b.add_node("right", lambda s: {"log": ["right"]})
    b.add_node("tail", lambda s: {"answer": "tail"})
    b.add_edge(impl.START, "left")
    b.add_edge(impl.START, "right")
    b.add_edge(["left", "right"], "tail")
    g = impl.compile(b, checkpointer=impl.saver(), interrupt_before=["tail"])
    cfg = _cfg("amb")
    g.invoke({"log": []}, cfg)
    return {
        "ambiguous": attempt(g.update_state, cfg, {"answer": "?"}),
        "explicit": _snapshot(
            g.get_state(g.update_state(cfg, {"answer": "human"}, as_node="right"))
        ),
    }


def test_update_state_ambiguous(conform: Conform) -> None:
    conform(update_state_ambiguous)


def edit_before_the_only_node(impl: Impl) -> Any:
    """Paused before a graph's one node (a breakpoint) or in it (an interrupt), an edit
    without ``as_node`` is the input's: the node then runs on the edited state."""
    calls = Calls()

    def check(state: State) -> dict[str, Any]:
        calls.add("check")
        if state["answer"] == "raise":
            impl.interrupt("answer first")
        return {"log": [f"checked {state['answer']}"]}

    b = impl.StateGraph(State)
    b.add_node("check", check)
    b.add_edge(impl.START, "check")
    out = {}
    for how, compile_kw in (("breakpoint", {"interrupt_before": ["check"]}), ("raise", {})):
        g = impl.compile(b, checkpointer=impl.saver(), **compile_kw)
        cfg = _cfg(f"edit-{how}")
        paused = g.invoke({"log": [], "answer": how}, cfg)
        edited = g.update_state(cfg, {"answer": "yes"})
        out[how] = {
            "paused": [getattr(i, "value", i) for i in paused.get("__interrupt__", [])],
            "edited": _snapshot(g.get_state(edited)),
            "resumed": g.invoke(None, cfg),
        }
    return {**out, "calls": calls.names}


def test_edit_before_the_only_node(conform: Conform) -> None:
    conform(edit_before_the_only_node)


def parallel_interrupts_answered_one_by_one(impl: Impl) -> Any:
    """Three nodes ask at once; answered one per run, each node's update applies once, also
    when each run stores its writes only at its end (``durability="exit"``)."""
    b = impl.StateGraph(State)
    for name in ("a", "b", "c"):
        b.add_node(name, lambda s, n=name: {"log": [f"{n}:{impl.interrupt(n.upper())}"]})
        b.add_edge(impl.START, name)
    out = {}
    for durability in ("sync", "exit"):
        g = impl.compile(b, checkpointer=impl.saver())
        cfg = _cfg(f"one-by-one-{durability}")
        result = g.invoke({"log": [], "answer": ""}, cfg, durability=durability)
        asked = []
        while pending := result.get("__interrupt__"):
            asked.append(len(pending))
            answer = impl.Command(resume={pending[0].id: "yes"})
            result = g.invoke(answer, cfg, durability=durability)
        out[durability] = {"log": sorted(result["log"]), "asked": asked}
    return out


def test_parallel_interrupts_answered_one_by_one(conform: Conform) -> None:
    conform(parallel_interrupts_answered_one_by_one)


def resume_from_checkpoint(impl: Impl) -> Any:
    calls = Calls()

    def ask(state: State) -> dict[str, Any]:
        calls.add("ask")
        return {"answer": impl.interrupt("color?")}

    b = impl.StateGraph(State)
    b.add_node("prep", lambda s: {"log": ["prep"]})
    b.add_node("ask", ask)
    b.add_edge(impl.START, "prep")
    b.add_edge("prep", "ask")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("ckpt")
    g.invoke({"log": []}, cfg)
    paused_cfg = g.get_state(cfg).config
    blue = g.invoke(impl.Command(resume="blue"), paused_cfg)
    red = g.invoke(impl.Command(resume="red"), paused_cfg)
    return {
        "blue": blue,
        "red": red,
        "latest": _snapshot(g.get_state(cfg)),
        "history": [(s.metadata["source"], s.metadata["step"]) for s in g.get_state_history(cfg)],
        "calls": calls.names,
    }


def test_resume_from_checkpoint(conform: Conform) -> None:
    conform(resume_from_checkpoint)


def interrupt_in_streams(impl: Impl) -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"answer": impl.interrupt({"need": "ok"})}

    b = impl.StateGraph(State)
    b.add_node("ask", ask)
    b.add_edge(impl.START, "ask")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("streams")
    paused = list(g.stream({"log": ["x"]}, cfg, stream_mode=["values", "updates"]))
    resumed = list(
        g.stream(
            impl.Command(resume="fine", update={"log": ["with update"]}),
            cfg,
            stream_mode=["values", "updates"],
        )
    )
    return {"paused": paused, "resumed": resumed}


def test_interrupt_in_streams(conform: Conform) -> None:
    conform(interrupt_in_streams)


def interrupt_in_send_task(impl: Impl) -> Any:
    order = FinishOrder([2, 1, 0])

    def fan(state: State) -> list[Any]:
        return [impl.Send("review", n) for n in range(3)]

    def review(n: int) -> dict[str, Any]:
        if n == 1:
            order.run(n)
            return {"log": ["1:auto"]}
        order.wait_turn(n)
        order.finish(n)  # interrupt() raises on the first run, so finish first
        return {"log": [f"{n}:{impl.interrupt(f'approve {n}?')}"]}

    b = impl.StateGraph(State)
    b.add_node("review", review)
    b.add_conditional_edges(impl.START, fan, ["review"])
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("send")
    first = g.invoke({"log": []}, cfg)
    state = g.get_state(cfg)
    answers = {i.id: i.value.split()[1].rstrip("?") + "-yes" for i in state.interrupts}
    return {
        "first": first,
        "finished": order.finished,
        "paused": _snapshot(state),
        "final": g.invoke(impl.Command(resume=answers), cfg),
    }


def test_interrupt_in_send_task(conform: Conform) -> None:
    conform(interrupt_in_send_task)


def resume_with_update_each_time(impl: Impl) -> Any:
    """Three ``Command(resume=…, update=…)`` on one paused task keep every update, once."""

    def ask_three_times(state: State) -> dict[str, Any]:
        answers = [impl.interrupt(str(n)) for n in (1, 2, 3)]
        return {"log": ["a:" + "".join(answers)]}

    seen: dict[str, Any] = {}
    for durability in ("sync", "async", "exit"):
        b = impl.StateGraph(State)
        b.add_node("a", ask_three_times)
        b.add_edge(impl.START, "a")
        g = impl.compile(b, checkpointer=impl.saver())
        cfg = _cfg(f"updates-{durability}")
        outs = [g.invoke({"log": []}, cfg, durability=durability)]
        for n in (1, 2, 3):
            cmd = impl.Command(resume=str(n), update={"log": [f"u{n}"]})
            outs.append(g.invoke(cmd, cfg, durability=durability))
        seen[durability] = {"outs": outs, "final": _snapshot(g.get_state(cfg))}
    return seen


def test_resume_with_update_each_time(conform: Conform) -> None:
    conform(resume_with_update_each_time)


def parallel_task_finishes_with_nothing(impl: Impl) -> Any:
    """A resumed task that returns ``None`` or ``{}`` is finished: not asked again, not rerun."""
    seen: dict[str, Any] = {}
    for label, returned in (("none", None), ("empty", {})):
        calls = Calls()

        def a(state: State, returned: Any = returned, calls: Calls = calls) -> Any:
            calls.add("a")
            impl.interrupt("A")
            return returned

        def b(state: State, calls: Calls = calls) -> dict[str, Any]:
            calls.add("b")
            return {"log": [f"b:{impl.interrupt('B')}"]}

        builder = impl.StateGraph(State)
        builder.add_node("a", a)
        builder.add_node("b", b)
        builder.add_edge(impl.START, "a")
        builder.add_edge(impl.START, "b")
        g = impl.compile(builder, checkpointer=impl.saver())
        cfg = _cfg(f"falsy-{label}")
        g.invoke({"log": []}, cfg)
        asked = {i.value: i.id for i in g.get_state(cfg).interrupts}
        g.invoke(impl.Command(resume={asked["A"]: "yes"}), cfg)
        between = _snapshot(g.get_state(cfg))
        asked = {i.value: i.id for i in g.get_state(cfg).interrupts}
        final = g.invoke(impl.Command(resume={asked["B"]: "ok"}), cfg)
        seen[label] = {
            "between": between,
            "final": final,
            "calls": sorted(calls.names),
        }
    return seen


def test_parallel_task_finishes_with_nothing(conform: Conform) -> None:
    conform(parallel_task_finishes_with_nothing)


class Answer(pydantic.BaseModel):
    """The answer an interrupt below expects."""

    name: str
    age: int


def interrupt_with_response_schema(impl: Impl) -> Any:
    """``interrupt(response_schema=…)``: the schema is shown; an answer that does not match
    it fails the run and the question stays open; a matching one arrives as the model."""

    def ask(state: State) -> dict[str, Any]:
        answer = impl.interrupt("who are you?", response_schema=Answer)
        return {"answer": f"{type(answer).__name__}:{answer.name}:{answer.age}", "log": ["ok"]}

    b = impl.StateGraph(State)
    b.add_node("ask", ask)
    b.add_edge(impl.START, "ask")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("schema")
    first = g.invoke({"log": []}, cfg)
    bad = attempt(g.invoke, impl.Command(resume={"name": "x"}), cfg)
    still = g.get_state(cfg).next
    done = g.invoke(impl.Command(resume={"name": "Ada", "age": "36"}), cfg)
    return {
        "schema": first["__interrupt__"][0].response_schema,
        "bad": type(bad).__name__,
        "still": still,
        "done": done,
    }


def test_interrupt_with_response_schema(conform: Conform) -> None:
    conform(interrupt_with_response_schema)


def invalid_resume_leaves_the_others_be(impl: Impl) -> Any:
    """An answer that fails its ``response_schema`` is marked (``is_invalid_resume``) and
    leaves that interrupt open, while the tasks answered rightly in the same resume finish
    (once: their side effects are not redone on the next resume)."""
    sent: list[str] = []

    def send(state: State) -> dict[str, Any]:
        impl.interrupt("send?", response_schema=Answer)
        sent.append("email")
        return {"log": ["sent"]}

    def check(state: State) -> dict[str, Any]:
        impl.interrupt("check?", response_schema=Answer)
        return {"log": ["checked"]}

    b = impl.StateGraph(State)
    b.add_node("send", send)
    b.add_node("check", check)
    b.add_edge(impl.START, "send")
    b.add_edge(impl.START, "check")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("invalid-resume")
    g.invoke({"log": []}, cfg)
    ids = {i.value: i.id for i in g.get_state(cfg).interrupts}
    good, bad = {"name": "Ada", "age": 36}, {"name": "Ada", "age": "old"}
    failed = attempt(g.invoke, impl.Command(resume={ids["send?"]: good, ids["check?"]: bad}), cfg)
    pending = [i.value for i in g.get_state(cfg).interrupts]
    done = g.invoke(impl.Command(resume={ids["check?"]: good}), cfg)
    return {
        "failed": type(failed).__name__,
        "marked": impl.errors.is_invalid_resume(failed),
        "other errors unmarked": impl.errors.is_invalid_resume(ValueError("x")),
        "pending": pending,
        "done": sorted(done["log"]),
        "sent": sent,
    }


def test_invalid_resume_leaves_the_others_be(conform: Conform) -> None:
    conform(invalid_resume_leaves_the_others_be)


def resume_map_reaches_parallel_subgraphs(impl: Impl) -> Any:
    """Sends to a subgraph that each pause: one ``Command(resume={id: answer})`` answers
    every subgraph's interrupt by its id."""

    class Child(TypedDict):
        prompt: str
        answers: list[str]

    def ask(state: Child) -> dict[str, Any]:
        return {"answers": [impl.interrupt(state["prompt"])]}

    child = impl.StateGraph(Child)
    child.add_node("ask", ask)
    child.add_edge(impl.START, "ask")
    child_graph = impl.compile(child, checkpointer=impl.saver())

    class Parent(TypedDict):
        prompts: list[str]
        answers: Annotated[list[str], operator.add]

    b = impl.StateGraph(Parent)
    b.add_node("child", child_graph)
    b.add_conditional_edges(
        impl.START, lambda s: [impl.Send("child", {"prompt": p}) for p in s["prompts"]], ["child"]
    )
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = _cfg("resume-map-subgraphs")
    first = g.invoke({"prompts": ["a", "b", "c"], "answers": []}, cfg)
    answers = {i.id: f"answer to {i.value}" for i in g.get_state(cfg).interrupts}
    return {
        "asked": sorted(i.value for i in first["__interrupt__"]),
        "done": g.invoke(impl.Command(resume=answers), cfg),
    }


def test_resume_map_reaches_parallel_subgraphs(conform: Conform) -> None:
    conform(resume_map_reaches_parallel_subgraphs)
