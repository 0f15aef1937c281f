"""Reading task statuses back from recorded pending writes."""

from __future__ import annotations

from typing import Any

import pytest

from bulksync.checkpoint.base import PendingWrite
from bulksync.constants import ERROR, INTERRUPT, NO_WRITES, NODE_ERROR, NULL_TASK_ID, RESUME
from bulksync.coordinator.status import pending_interrupt_ids, read_task_statuses
from bulksync.types import Interrupt

I1 = Interrupt("ask", id="i1")
I2 = Interrupt("ask2", id="i2")


@pytest.mark.parametrize(
    ("writes", "finished"),
    [
        ([("t", "a", 1)], True),
        ([("t", NO_WRITES, None)], True),  # succeeded without output
        ([("t", RESUME, ["yes"])], False),  # an answer alone is not output
        ([("t", ERROR, "boom")], False),
        ([("t", NODE_ERROR, ["n", "boom"]), ("t", ERROR, "handler")], False),  # handler crashed
        ([("t", INTERRUPT, [I1])], False),
        ([("t", INTERRUPT, [I1]), ("t", RESUME, ["y"]), ("t", "a", 2)], True),
    ],
)
def test_finished_iff_non_status_write(writes: list[PendingWrite], finished: bool) -> None:
    assert read_task_statuses(writes)["t"].finished is finished


def test_status_fields() -> None:
    writes: list[PendingWrite] = [
        ("t", "a", 1),
        ("t", "b", 2),
        ("u", ERROR, "first"),
        ("u", ERROR, "second"),
        ("u", RESUME, "one"),
        ("v", INTERRUPT, I1),
        ("v", INTERRUPT, [I2]),
    ]
    st = read_task_statuses(writes)
    assert st["t"].output == (("a", 1), ("b", 2))
    assert st["u"].error == "first"
    assert st["u"].resume == ("one",)
    assert st["v"].interrupts == (I1, I2)
    assert st["v"].pending_interrupts == (I1, I2)


@pytest.mark.parametrize(
    ("writes", "expected"),
    [
        ([(NULL_TASK_ID, "a", 1)], {}),
        ([(NULL_TASK_ID, "a", 1), ("t", "a", 2)], {"t": (("a", 2),)}),
    ],
)
def test_null_task_id_ignored(writes: list[PendingWrite], expected: dict[str, Any]) -> None:
    assert {k: s.output for k, s in read_task_statuses(writes).items()} == expected


@pytest.mark.parametrize(
    ("writes", "expected"),
    [
        ([], set()),
        ([("t", INTERRUPT, [I1])], {"i1"}),
        ([("t", INTERRUPT, [I1]), ("t", RESUME, ["y"])], {"i1"}),  # answered, not yet run
        ([("t", INTERRUPT, [I1]), ("t", "a", 1)], set()),  # task finished
        ([("t", INTERRUPT, [I1]), ("u", INTERRUPT, [I2]), ("u", NO_WRITES, None)], {"i1"}),
        ([(NULL_TASK_ID, INTERRUPT, [I1])], set()),
    ],
)
def test_pending_interrupt_ids(writes: list[PendingWrite], expected: set[str]) -> None:
    assert pending_interrupt_ids(writes) == expected
