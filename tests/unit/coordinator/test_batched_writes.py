"""The results a step has gathered are stored together: one ``put_writes_batch`` per batch
where the saver has it, ``put_writes`` per task where it has not; the same writes either way,
and a value no saver can store still named with its node and channel."""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.checkpoint.base import TaskWrites
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.errors import SerializationError
from bulksync.graph import START, StateGraph
from bulksync.types import Send

TASKS = 20


class State(TypedDict):
    out: Annotated[list[Any], operator.add]


class BatchingSaver(InMemorySaver):
    """An in-memory saver that stores batches itself, and says what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.single: list[str] = []

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.single.append(task_id)
        super().put_writes(config, writes, task_id, task_path)

    def put_writes_batch(self, config: Any, batch: Sequence[TaskWrites]) -> None:
        self.batches.append([task_id for _, task_id, _ in batch])
        for writes, task_id, path in batch:
            InMemorySaver.put_writes(self, config, writes, task_id, path)


def _fanout(saver: Any, value: Any = None) -> Any:
    def work(item: dict[str, Any]) -> dict[str, Any]:
        return {"out": [item["i"] if value is None else value]}

    b = StateGraph(State)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(TASKS)])
    return b.compile(checkpointer=saver)


def test_a_steps_results_are_stored_in_batches() -> None:
    saver = BatchingSaver()
    config = {"configurable": {"thread_id": "batched"}}
    assert _fanout(saver).invoke({"out": []}, config) == {"out": list(range(TASKS))}
    batched = [task for batch in saver.batches for task in batch]
    assert len(batched) == len(set(batched)) == TASKS + 1  # the input's task, then the Sends
    assert saver.single == []
    # What each task wrote is on the step's checkpoint, as put_writes would have stored it.
    history = list(_fanout(saver).get_state_history(config))
    sent = next(s for s in history if s.next == ("work",) * TASKS)
    assert sorted(t.result["out"][0] for t in sent.tasks) == list(range(TASKS))


def test_a_saver_without_batches_gets_each_tasks_writes() -> None:
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "single"}}
    assert _fanout(saver).invoke({"out": []}, config) == {"out": list(range(TASKS))}


@pytest.mark.parametrize("saver", [InMemorySaver, BatchingSaver])
def test_a_value_no_saver_can_store_names_its_node(saver: type[InMemorySaver]) -> None:
    graph = _fanout(saver(), value=threading.Lock())
    with pytest.raises(SerializationError, match="node 'work'"):
        graph.invoke({"out": []}, {"configurable": {"thread_id": "bad"}})
