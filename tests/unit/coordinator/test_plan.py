"""Planning a superstep on a hand-built GraphSpec: task paths, ids and triggering."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from bulksync.channels import (
    BaseChannel,
    BinaryOperatorAggregate,
    EphemeralValue,
    LastValue,
    NamedBarrierValue,
    Topic,
)
from bulksync.channels.base import MISSING
from bulksync.checkpoint.base import Checkpoint
from bulksync.constants import PULL, PUSH, TASKS
from bulksync.coordinator.plan import Task, prepare_next_tasks, task_path_str
from bulksync.coordinator.spec import GraphSpec, NodeSpec
from bulksync.errors import InvalidGraphError
from bulksync.types import Send

CKPT_A = "1ef00000-0000-6000-8000-000000000001"
CKPT_B = "1ef00000-0000-6000-8000-000000000002"


def node(name: str, triggers: tuple[str, ...], channels: tuple[str, ...] | str) -> NodeSpec:
    """A node that returns its input and writes nothing."""
    return NodeSpec(
        name=name,
        triggers=triggers,
        channels=channels,
        run=lambda x: x,
        writer=lambda out, read: [],
    )


def make_spec() -> GraphSpec:
    """alpha, beta on ``a``; gamma on ``eph``; delta on the ``join`` barrier."""
    nodes = {
        "beta": node("beta", ("a",), "a"),
        "alpha": node("alpha", ("a",), ("a", "items")),
        "gamma": node("gamma", ("eph",), "eph"),
        "delta": node("delta", ("join",), ("a",)),
    }
    channels: dict[str, BaseChannel[Any, Any]] = {
        "a": LastValue(int, key="a"),
        "items": BinaryOperatorAggregate(list, operator.add, key="items"),
        "eph": EphemeralValue(Any, key="eph"),
        "join": NamedBarrierValue(str, {"x", "y"}, key="join"),
        TASKS: Topic(Send, key=TASKS),
    }
    trigger_to_nodes: dict[str, tuple[str, ...]] = {}
    for n in nodes.values():
        for t in n.triggers:
            trigger_to_nodes[t] = (*trigger_to_nodes.get(t, ()), n.name)
    return GraphSpec(
        name="tiny",
        nodes=nodes,
        channels=channels,
        input_channels="a",
        output_channels=("a", "items"),
        stream_channels=("a", "items"),
        trigger_to_nodes=trigger_to_nodes,
        state_keys=("a", "items"),
    )


def make_checkpoint(
    values: dict[str, Any],
    versions: dict[str, int],
    seen: dict[str, dict[str, int]] | None = None,
    id: str = CKPT_A,
) -> Checkpoint:
    """A checkpoint holding ``values`` at ``versions``."""
    return Checkpoint(
        v=4,
        id=id,
        ts="2024-01-01T00:00:00+00:00",
        channel_values=values,
        channel_versions=versions,
        versions_seen=seen or {},
    )


def live(spec: GraphSpec, checkpoint: Checkpoint) -> dict[str, BaseChannel[Any, Any]]:
    """The spec's channels restored from ``checkpoint``."""
    return {
        k: c.from_checkpoint(checkpoint.channel_values.get(k, MISSING))
        for k, c in spec.channels.items()
    }


def plan(checkpoint: Checkpoint, step: int = 1, ns: str = "") -> dict[str, Task]:
    """Plan step ``step`` of the tiny graph from ``checkpoint``."""
    spec = make_spec()
    return prepare_next_tasks(spec, checkpoint, live(spec, checkpoint), step, ns)


# --- task_path_str -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("abc", "abc"),
        (7, "0000000007"),
        (True, "True"),
        ((PULL, "node"), f"~{PULL}, node"),
        ((PUSH, 3, False), f"~{PUSH}, 0000000003, False"),
        ((PUSH, (PULL, "x"), 12), f"~{PUSH}, ~{PULL}, x, 0000000012"),
    ],
)
def test_task_path_str_format(path: Any, expected: str) -> None:
    assert task_path_str(path) == expected


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ((PULL, "zeta"), (PUSH, 0, False)),  # every PULL before any PUSH
        ((PULL, "alpha"), (PULL, "beta")),  # PULL by node name
        ((PUSH, 2, False), (PUSH, 10, False)),  # zero-padding: numeric, not lexical
        ((PUSH, 9, False), (PUSH, 100, False)),
    ],
)
def test_task_path_str_orders(first: tuple[Any, ...], second: tuple[Any, ...]) -> None:
    assert task_path_str(first) < task_path_str(second)
    assert sorted([second, first], key=task_path_str) == [first, second]


# --- prepare_next_tasks --------------------------------------------------------------------

BASE_VALUES: dict[str, Any] = {"a": 1, TASKS: [Send("gamma", "s0"), Send("alpha", "s1")]}
BASE_VERSIONS = {"a": 2, TASKS: 2}


def test_same_checkpoint_plans_same_ids() -> None:
    ckpt = make_checkpoint(BASE_VALUES, BASE_VERSIONS)
    first, second = plan(ckpt), plan(ckpt)
    assert list(first) == list(second)
    assert [(t.name, t.path, t.input) for t in first.values()] == [
        (t.name, t.path, t.input) for t in second.values()
    ]


@pytest.mark.parametrize(
    ("change", "kwargs"),
    [
        ("checkpoint id", {"ckpt_id": CKPT_B}),
        ("step", {"step": 2}),
        ("namespace", {"ns": "parent:1"}),
    ],
)
def test_ids_depend_on_checkpoint_step_and_namespace(change: str, kwargs: dict[str, Any]) -> None:
    base = plan(make_checkpoint(BASE_VALUES, BASE_VERSIONS))
    ckpt = make_checkpoint(BASE_VALUES, BASE_VERSIONS, id=kwargs.get("ckpt_id", CKPT_A))
    other = plan(ckpt, step=kwargs.get("step", 1), ns=kwargs.get("ns", ""))
    assert len(other) == len(base) == 4
    assert set(other).isdisjoint(base), change


def test_push_tasks_first_then_pull_by_name() -> None:
    spec = make_spec()
    ckpt = make_checkpoint(BASE_VALUES, BASE_VERSIONS)
    planned = prepare_next_tasks(spec, ckpt, live(spec, ckpt), 1, updated_channels=["a", TASKS])
    tasks = list(planned.values())
    assert [(t.name, t.path) for t in tasks] == [
        ("gamma", (PUSH, 0, False)),
        ("alpha", (PUSH, 1, False)),
        ("alpha", (PULL, "alpha")),
        ("beta", (PULL, "beta")),
    ]
    assert [t.is_push for t in tasks] == [True, True, False, False]
    assert [t.input for t in tasks] == ["s0", "s1", {"a": 1, "items": []}, 1]
    assert all(t.step == 1 for t in tasks)


def test_task_namespace_names_node_and_id() -> None:
    tasks = plan(make_checkpoint(BASE_VALUES, BASE_VERSIONS), ns="outer:abc")
    for tid, task in tasks.items():
        assert task.id == tid
        assert task.checkpoint_ns == f"outer:abc|{task.name}:{tid}"


@pytest.mark.parametrize(
    ("versions", "seen", "expected"),
    [
        ({"a": 2}, {}, ["alpha", "beta"]),  # never ran: triggers
        ({"a": 2}, {"alpha": {"a": 2}}, ["beta"]),  # alpha saw this version
        ({"a": 2}, {"alpha": {"a": 2}, "beta": {"a": 2}}, []),
        ({"a": 3}, {"alpha": {"a": 2}, "beta": {"a": 3}}, ["alpha"]),  # newer than seen
        ({"a": 2}, {"alpha": {"a": 5}, "beta": {"a": 1}}, ["beta"]),
    ],
)
def test_node_triggers_only_on_unseen_version(
    versions: dict[str, int], seen: dict[str, dict[str, int]], expected: list[str]
) -> None:
    tasks = plan(make_checkpoint({"a": 1}, versions, seen))
    assert sorted(t.name for t in tasks.values()) == expected


@pytest.mark.parametrize(
    ("values", "versions", "expected"),
    [
        ({}, {}, []),  # no versions at all: nothing runs
        ({"eph": "e"}, {"eph": 1}, ["gamma"]),
        ({"join": {"x"}}, {"join": 1}, []),  # barrier not yet complete
        ({"join": {"x", "y"}}, {"join": 1}, ["delta"]),
    ],
)
def test_unavailable_trigger_does_not_fire(
    values: dict[str, Any], versions: dict[str, int], expected: list[str]
) -> None:
    tasks = plan(make_checkpoint(values, versions))
    assert [t.name for t in tasks.values()] == expected


def test_updated_channels_limits_candidates() -> None:
    spec = make_spec()
    ckpt = make_checkpoint({"a": 1, "eph": "e"}, {"a": 1, "eph": 1})
    tasks = prepare_next_tasks(spec, ckpt, live(spec, ckpt), 1, updated_channels=["eph"])
    assert [t.name for t in tasks.values()] == ["gamma"]


def test_send_to_unknown_node_raises() -> None:
    ckpt = make_checkpoint({TASKS: [Send("nope", 1)]}, {TASKS: 1})
    with pytest.raises(InvalidGraphError, match="nope"):
        plan(ckpt)


def test_pull_in_node_order_without_updated_channels() -> None:
    # Without the last step's updates every node is a candidate, in the order nodes were
    # added (LangGraph's rule); apply_writes sorts by task path, so state is unaffected.
    tasks = plan(make_checkpoint({"a": 1}, {"a": 1}))
    assert [t.name for t in tasks.values()] == [
        n for n in make_spec().nodes if n in tasks_names(tasks)
    ]


def tasks_names(tasks: dict[str, Task]) -> set[str]:
    """The node names of planned tasks."""
    return {t.name for t in tasks.values()}
