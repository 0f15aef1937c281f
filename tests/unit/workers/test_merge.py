"""Which messages of steps published together share one, what the shared one carries, and
how a worker reads it."""

from __future__ import annotations

from typing import Any

import pytest

from bulksync.workers.celery.node_task import _node_groups
from bulksync.workers.celery.publish import Outgoing, merge

NODE = "bulksync.g:graph.node"


def message(
    step: str, *, name: str = NODE, queue: str = "q", descs: Any = None, limit: float | None = 40
) -> Outgoing:
    """A message of ``step`` carrying one task, as ``StepMessages.of`` makes it."""
    return Outgoing(
        name=name,
        args=["g:graph", [], step, f"run-{step}", 30.0, [[b"d", 1]] if descs is None else descs],
        task_id=f"m-{step}-{name}-{queue}",
        queue=queue,
        headers={"bulksync": "g:graph"},
        argsrepr=f"run=run-{step} node=node task=t-{step}",
        time_limit=limit,
    )


def test_one_task_messages_of_one_node_from_different_steps_share_one() -> None:
    a, b, c = message("a"), message("b"), message("c", limit=None)
    out, joined = merge([a, b, c], most=2)
    assert joined == {a.task_id, b.task_id}
    shared, alone = out
    assert alone is c
    assert shared.name == NODE and shared.queue == "q" and shared.headers == a.headers
    assert shared.task_id not in {a.task_id, b.task_id, c.task_id}
    # Each group is what its own message carried after the graph id and path.
    assert shared.args == ["g:graph", [], [a.args[2:], b.args[2:]]]
    assert shared.argsrepr == f"{a.argsrepr} | {b.argsrepr}"  # Flower names every task
    assert shared.time_limit == 40 + 40 - 10  # the tasks' limits, one slack


def test_a_shared_message_has_no_time_limit_when_one_of_its_tasks_has_none() -> None:
    (shared,), _ = merge([message("a"), message("b", limit=None)], most=8)
    assert shared.time_limit is None


def test_other_nodes_queues_and_batches_keep_their_own_messages() -> None:
    separate = [
        message("a"),
        message("b", name="bulksync.g:graph.other"),
        message("c", queue="gpu"),
        message("d", descs=[[b"d", 1], [b"e", 2]]),  # a Send batch
        message("e", descs="batch:m"),  # descriptors in the step hash
    ]
    out, joined = merge(separate, most=8)
    assert sorted(out, key=lambda m: m.task_id) == sorted(separate, key=lambda m: m.task_id)
    assert joined == set()


def test_a_steps_own_messages_never_share_one() -> None:
    # Its fan-out was split to spread over the workers: it stays split.
    out, _ = merge([message("a"), message("a"), message("b")], most=8)
    shared = [m for m in out if len(m.args) == 3]
    assert len(out) == 2 and len(shared) == 1
    assert [g[0] for g in shared[0].args[2]] == ["a", "b"]


def test_most_one_shares_nothing() -> None:
    messages = [message("a"), message("b")]
    assert merge(messages, most=1) == (messages, set())


class Body:
    """A received message: what ``decode`` gives."""

    def __init__(self, args: Any) -> None:
        self.args = args

    def decode(self) -> Any:
        return [self.args, {}, {}]


def test_a_worker_reads_the_steps_of_a_plain_or_a_joined_message() -> None:
    plain = ["g:graph", [], "k1", "r1", 30.0, [[b"d", 1]]]
    assert _node_groups(Body(plain)) == [["k1", "r1", 30.0, [[b"d", 1]]]]
    (joined,), _ = merge([message("a"), message("b")], most=8)
    assert _node_groups(Body(joined.args)) == [message("a").args[2:], message("b").args[2:]]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["g:graph", []], "2 arguments where a node task has 6"),
        (["g:graph", [], "not a list"], "3 arguments where a node task has 6"),
        (None, "no arguments"),
        (["g:graph", [], [["k1", "r1", 30.0]]], "is not \\[step key"),
        (["g:graph", [], ["k1"]], "is not \\[step key"),
        (["g:graph", [], "k1", "r1", 30.0, 7], "is not \\[step key"),
    ],
)
def test_a_malformed_node_task_message_is_named(args: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        _node_groups(Body(args))
