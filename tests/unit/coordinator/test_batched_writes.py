"""The results a step has gathered are stored together: one ``put_writes_batch`` per
``STORE_AT`` results, or when the first kept has waited ``STORE_WITHIN``, where the saver has
it, ``put_writes`` per task where it has not; the step's last results with its checkpoint
(``put_step``) where the saver can; the same writes either way, a value no saver can store
still named with its node and channel, and writes a step could not apply stored."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.checkpoint.base import TaskWrites
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.coordinator import ledger
from bulksync.errors import InvalidUpdateError, SerializationError
from bulksync.graph import END, START, StateGraph
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


class StepSaver(BatchingSaver):
    """A batching saver that also stores a step's last writes with its checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[list[str]] = []

    def put_step(
        self,
        config: Any,
        batch: Sequence[TaskWrites],
        checkpoint: Any,
        metadata: Any,
        new_versions: Any,
    ) -> Any:
        self.steps.append([task_id for _, task_id, _ in batch])
        for writes, task_id, path in batch:
            InMemorySaver.put_writes(self, config, writes, task_id, path)
        return self.put(config, checkpoint, metadata, new_versions)


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


def test_a_steps_last_results_are_stored_with_its_checkpoint() -> None:
    saver = StepSaver()
    config = {"configurable": {"thread_id": "steps"}}
    assert _fanout(saver).invoke({"out": []}, config) == {"out": list(range(TASKS))}
    stored = [t for batch in saver.batches for t in batch] + [t for s in saver.steps for t in s]
    assert len(stored) == len(set(stored)) == TASKS + 1  # each task's writes stored once
    # The input's checkpoint has no writes; each step's last ones go with its checkpoint.
    assert [bool(step) for step in saver.steps] == [False, True, True]
    history = list(_fanout(saver).get_state_history(config))
    sent = next(s for s in history if s.next == ("work",) * TASKS)
    assert sorted(t.result["out"][0] for t in sent.tasks) == list(range(TASKS))


class Plain(TypedDict):
    x: int


@pytest.mark.parametrize("saver", [InMemorySaver, StepSaver])
def test_writes_a_step_cannot_apply_are_stored(saver: type[InMemorySaver]) -> None:
    b = StateGraph(Plain)
    b.add_node("a", lambda s: {"x": 1})
    b.add_node("b", lambda s: {"x": 2})
    b.add_edge(START, "a")
    b.add_edge(START, "b")
    b.add_edge("a", END)
    b.add_edge("b", END)
    store = saver()
    config = {"configurable": {"thread_id": "conflict"}}
    with pytest.raises(InvalidUpdateError):
        b.compile(checkpointer=store).invoke({"x": 0}, config)
    head = store.get_tuple(config)
    assert head is not None
    assert sorted(v for _, c, v in head.pending_writes if c == "x") == [1, 2]


def test_results_arriving_together_are_stored_in_large_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger, "STORE_WITHIN", 60.0)  # only the count stores them early
    quick, many = ledger.STORE_AT + 10, ledger.STORE_AT * 2 + 50
    stored = threading.Event()

    class Saver(StepSaver):
        def put_writes_batch(self, config: Any, batch: Sequence[TaskWrites]) -> None:
            super().put_writes_batch(config, batch)
            stored.set()

    def work(item: dict[str, Any]) -> dict[str, Any]:
        if item["i"] >= quick:  # the rest finish once the quick ones are stored
            assert stored.wait(10), "the quick tasks' writes were not stored before the step end"
        return {"out": [item["i"]]}

    b = StateGraph(State)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(many)])
    saver = Saver()
    config = {"configurable": {"thread_id": "large"}}
    assert b.compile(checkpointer=saver).invoke({"out": []}, config) == {"out": list(range(many))}
    assert saver.batches
    assert all(len(batch) >= ledger.STORE_AT for batch in saver.batches)
    every = [t for batch in saver.batches for t in batch] + [t for s in saver.steps for t in s]
    assert len(every) == len(set(every)) == many + 1


def test_a_kept_result_is_stored_while_the_step_waits_for_the_others() -> None:
    release = threading.Event()

    def work(item: dict[str, Any]) -> dict[str, Any]:
        if item["i"]:
            release.wait(10)
        return {"out": [item["i"]]}

    b = StateGraph(State)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(2)])
    saver = StepSaver()
    config = {"configurable": {"thread_id": "kept"}}
    graph = b.compile(checkpointer=saver)
    outcome: list[Any] = []
    runner = threading.Thread(target=lambda: outcome.append(graph.invoke({"out": []}, config)))
    runner.start()
    deadline = time.monotonic() + 5
    while not saver.batches and time.monotonic() < deadline:
        time.sleep(0.005)
    stored_early = [list(batch) for batch in saver.batches]
    release.set()
    runner.join(10)
    assert outcome == [{"out": [0, 1]}]
    assert len(stored_early) == 1 and len(stored_early[0]) == 1  # the quick task's writes
