"""Golden superstep traces: the pure core replayed byte for byte from stored data.

Each ``traces/<scenario>.json`` records every call one real run of a small graph made into
the pure core — ``prepare_next_tasks``, ``apply_writes`` and ``create_checkpoint`` — with the
call's inputs (checkpoint, channel values, versions, task writes, and what the loop minted
for it: the version bits and the checkpoint stamp) and its outputs (task ids, paths and
inputs; updated channels, versions and channel values; checkpoint records). The replay
rebuilds each call's inputs from the data, calls the function, encodes the result the same
way and compares the text with the stored text, byte for byte. So a change to task-id
hashing, to planning, to the write-ordering rule or to the version scheme fails here, on
plain data, before any conformance test has to notice.

Values are plain data in JSON; the few non-JSON shapes are tagged objects with one ``$`` key
(``{"$tuple": [...]}``, ``{"$send": [node, arg]}``, ``{"$interrupt": [value, id]}``,
``{"$missing": null}`` for an empty channel).

Regenerating the traces is an explicit act, for a deliberate change of the scheme::

    BULKSYNC_REGEN_TRACES=1 pytest tests/unit/coordinator/test_traces.py

It reruns the scenarios under a fake clock (counted checkpoint ids, a fixed time, counted
version bits, so the files do not change from one regeneration to the next) and rewrites
the files; review their diff before committing it. A normal run never writes them.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from bulksync import ids
from bulksync.channels.base import MISSING, BaseChannel
from bulksync.checkpoint.base import Checkpoint
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.coordinator import apply, clock, first_step, ledger, loop, plan
from bulksync.coordinator.apply import Stamp, TaskWrites, Versions
from bulksync.coordinator.spec import GraphSpec
from bulksync.graph import END, START, CompiledStateGraph, StateGraph
from bulksync.types import Command, Interrupt, Send, interrupt

TRACES = Path(__file__).parent / "traces"
REGEN = os.environ.get("BULKSYNC_REGEN_TRACES") == "1"

# -- the scenarios ----------------------------------------------------------------------


class Chain(TypedDict):
    """State of the chain, branch, goto and interrupt graphs."""

    x: int
    log: Annotated[list[str], operator.add]


def _step(name: str, inc: int) -> Callable[[Chain], dict[str, Any]]:
    def node(state: Chain) -> dict[str, Any]:
        return {"x": state["x"] + inc, "log": [name]}

    return node


def build_chain() -> CompiledStateGraph:
    """``a → b → c``: three PULL steps, one reducer and one last-value key."""
    g = StateGraph(Chain)
    g.add_node("a", _step("a", 1))
    g.add_node("b", _step("b", 10))
    g.add_node("c", _step("c", 100))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile()


def build_branch() -> CompiledStateGraph:
    """A conditional edge after ``check`` picks ``small`` or ``big``."""
    g = StateGraph(Chain)
    g.add_node("check", _step("check", 0))
    g.add_node("small", _step("small", 1))
    g.add_node("big", _step("big", -1))
    g.add_edge(START, "check")
    g.add_conditional_edges("check", lambda s: "big" if s["x"] > 5 else "small")
    g.add_edge("small", END)
    g.add_edge("big", END)
    return g.compile()


class FanOut(TypedDict):
    """State of the fan-out graph: one Send per word, lengths gathered by a reducer."""

    words: list[str]
    lengths: Annotated[list[int], operator.add]


def build_fanout() -> CompiledStateGraph:
    """``Send`` per word to ``measure`` (PUSH tasks), gathered by an ``add`` reducer."""
    g = StateGraph(FanOut)
    g.add_node("measure", lambda task: {"lengths": [len(task["word"])]})
    g.add_node("done", lambda s: {"lengths": [sum(s["lengths"])]})
    g.add_conditional_edges(START, lambda s: [Send("measure", {"word": w}) for w in s["words"]])
    g.add_edge("measure", "done")
    g.add_edge("done", END)
    return g.compile()


def build_interrupt() -> CompiledStateGraph:
    """``ask`` pauses on ``interrupt()``; a ``Command(resume=...)`` answers it."""

    def ask(state: Chain) -> dict[str, Any]:
        answer = interrupt({"question": "how many?"})
        return {"x": state["x"] + int(answer), "log": ["ask"]}

    g = StateGraph(Chain)
    g.add_node("prepare", _step("prepare", 1))
    g.add_node("ask", ask)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=InMemorySaver())


def build_subgraph() -> CompiledStateGraph:
    """A compiled graph added as a node: a nested loop under the parent's task namespace."""
    child = StateGraph(Chain)
    child.add_node("inner_a", _step("inner_a", 2))
    child.add_node("inner_b", _step("inner_b", 3))
    child.add_edge(START, "inner_a")
    child.add_edge("inner_a", "inner_b")
    child.add_edge("inner_b", END)
    g = StateGraph(Chain)
    g.add_node("before", _step("before", 1))
    g.add_node("sub", child.compile())
    g.add_node("after", _step("after", 1))
    g.add_edge(START, "before")
    g.add_edge("before", "sub")
    g.add_edge("sub", "after")
    g.add_edge("after", END)
    return g.compile()


def build_goto() -> CompiledStateGraph:
    """``route`` returns ``Command(update=..., goto=...)`` instead of having an edge."""

    def route(state: Chain) -> Command[Any]:
        return Command(update={"log": ["route"]}, goto="left" if state["x"] % 2 else "right")

    g = StateGraph(Chain)
    g.add_node("route", route, destinations=("left", "right"))
    g.add_node("left", _step("left", 1))
    g.add_node("right", _step("right", 2))
    g.add_edge(START, "route")
    g.add_edge("left", END)
    g.add_edge("right", END)
    return g.compile()


def _run_interrupt(graph: CompiledStateGraph) -> None:
    config = {"configurable": {"thread_id": "trace"}}
    graph.invoke({"x": 1, "log": []}, config)
    graph.invoke(Command(resume="5"), config)


SCENARIOS: dict[str, tuple[Callable[[], CompiledStateGraph], Callable[[Any], Any]]] = {
    "chain": (build_chain, lambda g: g.invoke({"x": 0, "log": []})),
    "branch": (build_branch, lambda g: g.invoke({"x": 7, "log": []})),
    "fanout": (build_fanout, lambda g: g.invoke({"words": ["map", "reduce", "superstep"]})),
    "interrupt_resume": (build_interrupt, _run_interrupt),
    "subgraph": (build_subgraph, lambda g: g.invoke({"x": 0, "log": []})),
    "command_goto": (build_goto, lambda g: g.invoke({"x": 3, "log": []})),
}
"""Scenario → (build the graph, run it); the runs are what the traces record."""


def specs_of(graph: CompiledStateGraph, name: str) -> Iterator[tuple[str, GraphSpec]]:
    """``(name, spec)`` of a graph and, as ``name/node``, of each subgraph node."""
    yield name, graph.spec
    for node in graph.spec.nodes.values():
        if node.subgraph is not None:
            yield from specs_of(node.subgraph, f"{name}/{node.name}")


# -- plain data in and out ----------------------------------------------------------------


def encode(value: Any) -> Any:
    """``value`` as JSON-ready plain data, non-JSON shapes tagged with one ``$`` key."""
    if value is MISSING:
        return {"$missing": None}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, Send):
        return {"$send": [value.node, encode(value.arg)]}
    if isinstance(value, Interrupt) and value.response_schema is None:
        return {"$interrupt": [encode(value.value), value.id]}
    if isinstance(value, dict) and all(isinstance(k, str) and k[:1] != "$" for k in value):
        return {k: encode(v) for k, v in value.items()}
    raise TypeError(f"trace values must be plain data; got {value!r}")


def decode(data: Any) -> Any:
    """The inverse of ``encode``."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        ((key, payload),) = data.items()
        if key == "$missing":
            return MISSING
        if key == "$tuple":
            return tuple(decode(v) for v in payload)
        if key == "$send":
            return Send(payload[0], decode(payload[1]))
        if key == "$interrupt":
            return Interrupt(value=decode(payload[0]), id=payload[1])
    return {k: decode(v) for k, v in data.items()}


def text(data: Any) -> str:
    """The canonical text of encoded data: what the byte-for-byte comparison compares."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def checkpoint_data(c: Checkpoint) -> dict[str, Any]:
    """A checkpoint record as plain data, fields in declaration order."""
    return {f.name: encode(getattr(c, f.name)) for f in dataclasses.fields(c)}


def checkpoint_of(data: Mapping[str, Any]) -> Checkpoint:
    """The checkpoint record ``checkpoint_data`` encoded."""
    return Checkpoint(**{k: decode(v) for k, v in data.items()})


def channel_values(channels: Mapping[str, BaseChannel[Any, Any]]) -> dict[str, Any]:
    """What each channel stores (``$missing`` when empty), in the spec's key order."""
    return {k: encode(c.checkpoint()) for k, c in channels.items()}


def channels_of(spec: GraphSpec, values: Mapping[str, Any]) -> dict[str, BaseChannel[Any, Any]]:
    """Live channels of ``spec`` holding the recorded values."""
    return {k: spec.channels[k].from_checkpoint(decode(v)) for k, v in values.items()}


def versions_data(v: Versions) -> dict[str, Any]:
    """Channel versions and versions seen as plain data."""
    return {"channel_versions": dict(v.channel_versions), "versions_seen": v.versions_seen}


def versions_of(data: Mapping[str, Any]) -> Versions:
    """The ``Versions`` ``versions_data`` encoded (a private copy)."""
    return Versions(
        dict(data["channel_versions"]), {k: dict(s) for k, s in data["versions_seen"].items()}
    )


def maybe_sorted(names: Iterable[str] | None) -> list[str] | None:
    """A set of channel names as a sorted list (order never matters to the core)."""
    return None if names is None else sorted(names)


# -- one call of the core: from data to data ----------------------------------------------


def call_plan(spec: GraphSpec, args: Mapping[str, Any]) -> Any:
    """Replay ``prepare_next_tasks``: the planned tasks, in order, as data."""
    tasks = plan.prepare_next_tasks(
        spec,
        checkpoint_of(args["checkpoint"]),
        channels_of(spec, args["channels"]),
        args["step"],
        args["parent_ns"],
        args["updated_channels"],
    )
    return [
        {f.name: encode(getattr(t, f.name)) for f in dataclasses.fields(t)} for t in tasks.values()
    ]


def call_apply(spec: GraphSpec, args: Mapping[str, Any]) -> Any:
    """Replay ``apply_writes``: updated channels, versions and channel values after it."""
    versions = versions_of(args["versions"])
    channels = channels_of(spec, args["channels"])
    tasks = [
        TaskWrites(t["name"], decode(t["path"]), decode(t["writes"]), decode(t["triggers"]))
        for t in args["tasks"]
    ]
    updated = apply.apply_writes(
        versions,
        channels,
        tasks,
        decode(args["trigger_to_nodes"]),
        version_bits=args["version_bits"],
    )
    return {
        "updated": sorted(updated),
        "versions": versions_data(versions),
        "channels": channel_values(channels),
    }


def call_checkpoint(spec: GraphSpec, args: Mapping[str, Any]) -> Any:
    """Replay ``create_checkpoint``: the new checkpoint record."""
    values = args["channels"]
    checkpoint = apply.create_checkpoint(
        checkpoint_of(args["previous"]),
        None if values is None else channels_of(spec, values),
        versions_of(args["versions"]),
        args["updated_channels"],
        stamp=Stamp(**args["stamp"]),
    )
    return checkpoint_data(checkpoint)


CALLS: dict[str, Callable[[GraphSpec, Mapping[str, Any]], Any]] = {
    "prepare_next_tasks": call_plan,
    "apply_writes": call_apply,
    "create_checkpoint": call_checkpoint,
}


# -- recording ----------------------------------------------------------------------------


class FakeClock:
    """Counted checkpoint ids, a fixed time and counted version bits: stable traces."""

    def __init__(self) -> None:
        self.ids = 0
        self.bits = 0

    def stamp(self, step: int) -> Stamp:
        """The next counted id (UUID-shaped, sorting in creation order) and the fixed time."""
        self.ids += 1
        return Stamp(f"00000000-0000-6000-8000-{self.ids:012x}", self.now())

    def now(self) -> str:
        """A fixed time."""
        return "2024-01-01T00:00:00+00:00"

    def version_bits(self) -> int:
        """Counted bits, spread over the low bits by a golden-ratio multiplier."""
        self.bits += 1
        return (self.bits * 0x9E3779B1) & ((1 << apply.VERSION_RANDOM_BITS) - 1)


def record(name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run scenario ``name`` with the core's calls wrapped; return the trace as data."""
    build, run = SCENARIOS[name]
    graph = build()
    names = {id(spec): n for n, spec in specs_of(graph, name)}
    calls: list[dict[str, Any]] = []
    fake = FakeClock()
    for attr in ("stamp", "now", "version_bits"):
        monkeypatch.setattr(clock, attr, getattr(fake, attr))

    def plan_call(
        spec: GraphSpec,
        checkpoint: Checkpoint,
        channels: Mapping[str, BaseChannel[Any, Any]],
        step: int,
        parent_ns: str = "",
        updated_channels: Iterable[str] | None = None,
        managed: Mapping[str, Any] | None = None,
    ) -> dict[str, plan.Task]:
        args = {
            "checkpoint": checkpoint_data(checkpoint),
            "channels": channel_values(channels),
            "step": step,
            "parent_ns": parent_ns,
            "updated_channels": maybe_sorted(updated_channels),
        }
        if managed:  # the traced graphs have no managed keys: their traces stay as stored
            args["managed"] = dict(managed)
        tasks = plan.prepare_next_tasks(
            spec, checkpoint, channels, step, parent_ns, updated_channels, managed
        )
        calls.append({"call": "prepare_next_tasks", "graph": names[id(spec)], "args": args})
        return tasks

    def apply_call(
        versions: Versions,
        channels: Mapping[str, BaseChannel[Any, Any]],
        tasks: Iterable[TaskWrites],
        trigger_to_nodes: Mapping[str, Any],
        *,
        version_bits: int,
    ) -> set[str]:
        tasks = list(tasks)
        spec = spec_with(channels)
        args = {
            "versions": versions_data(versions),
            "channels": channel_values(channels),
            "tasks": [
                {
                    "name": t.name,
                    "path": encode(t.path),
                    "writes": encode([tuple(w) for w in t.writes]),
                    "triggers": encode(t.triggers),
                }
                for t in tasks
            ],
            "trigger_to_nodes": encode(dict(trigger_to_nodes)),
            "version_bits": version_bits,
        }
        updated = apply.apply_writes(
            versions, channels, tasks, trigger_to_nodes, version_bits=version_bits
        )
        calls.append({"call": "apply_writes", "graph": names[id(spec)], "args": args})
        return updated

    def checkpoint_call(
        previous: Checkpoint,
        channels: Mapping[str, BaseChannel[Any, Any]] | None,
        versions: Versions,
        updated_channels: Iterable[str] | None,
        *,
        stamp: Stamp,
    ) -> Checkpoint:
        spec = graph.spec if channels is None else spec_with(channels)
        args = {
            "previous": checkpoint_data(previous),
            "channels": None if channels is None else channel_values(channels),
            "versions": versions_data(versions),
            "updated_channels": maybe_sorted(updated_channels),
            "stamp": dataclasses.asdict(stamp),
        }
        checkpoint = apply.create_checkpoint(
            previous, channels, versions, updated_channels, stamp=stamp
        )
        calls.append({"call": "create_checkpoint", "graph": names[id(spec)], "args": args})
        return checkpoint

    def spec_with(channels: Mapping[str, Any]) -> GraphSpec:
        # apply and checkpoint calls do not get the spec: find it by its channels.
        (spec,) = (s for _, s in specs_of(graph, name) if set(s.channels) == set(channels))
        return spec

    monkeypatch.setattr(loop, "prepare_next_tasks", plan_call)
    monkeypatch.setattr(loop, "apply_writes", apply_call)
    monkeypatch.setattr(first_step, "apply_writes", apply_call)  # the input's writes
    monkeypatch.setattr(ledger, "create_checkpoint", checkpoint_call)
    run(graph)
    for entry in calls:
        spec = dict(specs_of(graph, name))[entry["graph"]]
        entry["output"] = CALLS[entry["call"]](spec, entry["args"])
    return {"scenario": name, "calls": calls}


# -- the tests ----------------------------------------------------------------------------


def load(name: str) -> dict[str, Any]:
    """The stored trace of scenario ``name``."""
    data: dict[str, Any] = json.loads((TRACES / f"{name}.json").read_text())
    return data


def replay(trace: Mapping[str, Any]) -> None:
    """Replay every call of ``trace``; fail on the first output that differs by a byte."""
    build, _ = SCENARIOS[trace["scenario"]]
    specs = dict(specs_of(build(), trace["scenario"]))
    for i, entry in enumerate(trace["calls"]):
        got = CALLS[entry["call"]](specs[entry["graph"]], entry["args"])
        where = f"{trace['scenario']} call {i} ({entry['call']} on {entry['graph']})"
        assert text(got) == text(entry["output"]), where


@pytest.mark.skipif(not REGEN, reason="set BULKSYNC_REGEN_TRACES=1 to rewrite the traces")
def test_regenerate(monkeypatch: pytest.MonkeyPatch) -> None:
    TRACES.mkdir(exist_ok=True)
    for name in sorted(SCENARIOS):
        trace = record(name, monkeypatch)
        body = json.dumps(trace, ensure_ascii=False, indent=1) + "\n"
        (TRACES / f"{name}.json").write_text(body)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_replay_matches_the_recorded_trace(name: str) -> None:
    trace = load(name)
    calls = {entry["call"] for entry in trace["calls"]}
    assert calls == set(CALLS), "a trace records plan, apply and checkpoint calls"
    replay(trace)


def test_a_fresh_recording_matches_the_stored_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stored inputs are what the loop really passes today, not only self-consistent.
    for name in sorted(SCENARIOS):
        assert text(record(name, monkeypatch)) == text(load(name)), name


def _reversed_path_order(path: Any) -> tuple[int, ...]:
    return tuple(-ord(c) for c in plan.task_path_str(path))


@pytest.mark.parametrize(
    ("module", "attr", "changed"),
    [
        (plan, "task_id", lambda cid, *parts: ids.task_id(cid, *parts, "x")),
        (apply, "task_path_str", _reversed_path_order),
    ],
    ids=["task-id hash", "write order"],
)
def test_replay_notices_a_changed_rule(
    module: Any, attr: str, changed: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, attr, changed)
    with pytest.raises(AssertionError):
        for name in sorted(SCENARIOS):
            replay(load(name))
