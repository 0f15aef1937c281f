"""Applying a step's writes: order, versions, ephemeral clearing, errors and finish()."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import pytest

from bulksync.channels import (
    BaseChannel,
    BinaryOperatorAggregate,
    EphemeralValue,
    LastValue,
    NamedBarrierValueAfterFinish,
)
from bulksync.constants import NO_WRITES, PULL, PUSH
from bulksync.coordinator.apply import (
    VERSION_RANDOM_BITS,
    TaskWrites,
    Versions,
    apply_writes,
    next_channel_version,
)
from bulksync.errors import InvalidUpdateError


def channels() -> dict[str, BaseChannel[Any, Any]]:
    """Fresh live channels: a LastValue, a list reducer and an ephemeral."""
    return {
        "a": LastValue(int, key="a"),
        "items": BinaryOperatorAggregate(list, operator.add, key="items"),
        "eph": EphemeralValue(Any, key="eph"),
    }


TRIGGERS: dict[str, tuple[str, ...]] = {"a": ("n1",), "items": ("n2",), "eph": ("n3",)}

BITS = 0x5A5A5
"""The random low bits of a step's version, as the loop would draw them (``clock``)."""

TASKS = [
    TaskWrites("beta", (PULL, "beta"), [("items", ["beta"])], ("a",)),
    TaskWrites("alpha", (PULL, "alpha"), [("items", ["alpha"])], ("a",)),
    TaskWrites("s", (PUSH, 10, False), [("items", ["push10"])], (PUSH,)),
    TaskWrites("s", (PUSH, 2, False), [("items", ["push2"])], (PUSH,)),
]


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_writes_applied_in_task_path_order(order: tuple[int, ...]) -> None:
    chans = channels()
    apply_writes(Versions({}, {}), chans, [TASKS[i] for i in order], TRIGGERS, version_bits=BITS)
    assert chans["items"].get() == ["alpha", "beta", "push2", "push10"]


def test_one_shared_version_for_every_updated_channel() -> None:
    chans = channels()
    versions = Versions({"a": 5, "items": 7}, {})
    chans["a"].update([1])
    tasks = [
        TaskWrites("n1", (PULL, "n1"), [("a", 2), ("items", [1])], ("a",)),
        TaskWrites("n2", (PULL, "n2"), [("eph", "e"), (NO_WRITES, None)], ("a",)),
    ]
    updated = apply_writes(versions, chans, tasks, TRIGGERS, version_bits=BITS)
    assert updated == {"a", "items", "eph"}
    new = {versions.channel_versions[c] for c in updated}
    assert len(new) == 1
    assert new.pop() > 7
    assert NO_WRITES not in versions.channel_versions


def test_versions_seen_recorded_from_triggers() -> None:
    chans = channels()
    versions = Versions({"a": 3, "items": 4}, {"n1": {"a": 1}})
    tasks = [
        TaskWrites("n1", (PULL, "n1"), [("a", 9)], ("a",)),
        TaskWrites("n2", (PULL, "n2"), [], ("a", "items", "missing")),
    ]
    apply_writes(versions, chans, tasks, TRIGGERS, version_bits=BITS)
    # Seen versions are those the tasks ran on, not the bumped ones.
    assert versions.versions_seen["n1"] == {"a": 3}
    assert versions.versions_seen["n2"] == {"a": 3, "items": 4}


@pytest.mark.parametrize(
    ("task_triggers", "cleared"),
    [
        (("a",), True),  # a step that ran tasks clears the ephemeral
        ((), False),  # input-only writes (no triggers) keep it
    ],
)
def test_ephemeral_cleared_on_bump_step(task_triggers: tuple[str, ...], cleared: bool) -> None:
    chans = channels()
    chans["eph"].update(["old"])
    versions = Versions({"eph": 1, "a": 1}, {})
    tasks = [TaskWrites("n", (PULL, "n"), [], task_triggers)]
    apply_writes(versions, chans, tasks, TRIGGERS, version_bits=BITS)
    assert chans["eph"].is_available() is not cleared
    assert (versions.channel_versions["eph"] > 1) is cleared


def test_last_value_double_write_raises() -> None:
    tasks = [
        TaskWrites("n1", (PULL, "n1"), [("a", 1)], ("x",)),
        TaskWrites("n2", (PULL, "n2"), [("a", 2)], ("x",)),
    ]
    with pytest.raises(InvalidUpdateError):
        apply_writes(Versions({}, {}), channels(), tasks, TRIGGERS, version_bits=BITS)


def test_raising_reducer_gets_note_naming_key_and_node() -> None:
    def boom(a: Any, b: Any) -> Any:
        raise ValueError("bad reducer")

    chans: dict[str, BaseChannel[Any, Any]] = {"total": BinaryOperatorAggregate(int, boom)}
    tasks = [TaskWrites("adder", (PULL, "adder"), [("total", 1)], ("x",))]
    with pytest.raises(ValueError, match="bad reducer") as info:
        apply_writes(Versions({}, {}), chans, tasks, {}, version_bits=BITS)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1
    assert "'total'" in notes[0]
    assert "adder" in notes[0]


@pytest.mark.parametrize(
    ("trigger_to_nodes", "released"),
    [
        ({}, True),  # nothing else triggers: deferred barrier released
        ({"items": ("n2",)}, False),  # another node will run: not yet
    ],
)
def test_finish_releases_when_nothing_else_triggers(
    trigger_to_nodes: dict[str, tuple[str, ...]], released: bool
) -> None:
    chans = channels()
    chans["join"] = NamedBarrierValueAfterFinish(str, {"x", "y"}, key="join")
    tasks = [
        TaskWrites("x", (PULL, "x"), [("join", "x"), ("items", [1])], ("a",)),
        TaskWrites("y", (PULL, "y"), [("join", "y")], ("a",)),
    ]
    versions = Versions({"a": 1}, {})
    updated = apply_writes(versions, chans, tasks, trigger_to_nodes, version_bits=BITS)
    assert chans["join"].is_available() is released
    assert ("join" in updated) is released


def test_new_version_counts_steps_in_the_high_bits_and_carries_the_given_low_bits() -> None:
    first = next_channel_version(0, 7)
    assert first == (1 << VERSION_RANDOM_BITS) | 7
    second = next_channel_version(first, BITS)
    assert second >> VERSION_RANDOM_BITS == 2
    assert second & ((1 << VERSION_RANDOM_BITS) - 1) == BITS
    # Two branches forked from one version differ whenever their random bits do.
    assert next_channel_version(first, 1) != next_channel_version(first, 2)
    # Extra high bits in ``random_bits`` never disturb the step counter.
    assert next_channel_version(first, (5 << VERSION_RANDOM_BITS) | 3) == next_channel_version(
        first, 3
    )


def test_one_step_version_comes_from_the_given_bits() -> None:
    versions = Versions({"a": 1 << VERSION_RANDOM_BITS}, {})
    tasks = [TaskWrites("n1", (PULL, "n1"), [("a", 2)], ("a",))]
    apply_writes(versions, channels(), tasks, TRIGGERS, version_bits=BITS)
    assert versions.channel_versions["a"] == next_channel_version(1 << VERSION_RANDOM_BITS, BITS)
