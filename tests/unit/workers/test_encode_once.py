"""A write is encoded once: a worker's bytes become the pending write and the channel's blob,
and the next step's input reuses them, with no decode-and-encode on the way."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypedDict

from bulksync.checkpoint.base import Encoded
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.checkpoint.serde import MsgpackSerde
from bulksync.constants import TASKS
from bulksync.coordinator.executor import StepInput, StepLive, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec
from bulksync.graph import END, START, StateGraph
from bulksync.types import Send
from bulksync.workers import wire
from bulksync.workers.remote import run_encoded

MARK = "written-once-" + "x" * 20


class State(TypedDict, total=False):
    note: str
    log: Annotated[list[str], operator.add]


class WireExecutor:
    """Runs each task from bytes, as a cluster worker would, in this thread."""

    def __init__(self) -> None:
        self.steps: list[StepInput] = []

    def submit(
        self,
        spec: GraphSpec,
        step: StepInput,
        live: StepLive,
        tasks: Sequence[Task],
        deliver: Callable[[TaskResult], None],
    ) -> Any:
        self.steps.append(step)
        state = wire.dumps_state(step)
        for task in tasks:
            desc = wire.dumps_descriptor(wire.TaskDescriptor.of(task, task.id))
            data = wire.dumps_input(task.input, task)
            deliver(wire.loads_result(run_encoded(spec, state, desc, data, live.sink)))
        return self

    def cancel(self) -> None:
        pass


class Counting(MsgpackSerde):
    """The saver's serde, noting every value it encodes."""

    def __init__(self) -> None:
        super().__init__()
        self.dumped: list[Any] = []

    def dumps(self, value: Any) -> bytes:
        self.dumped.append(value)
        return super().dumps(value)


def graph(saver: InMemorySaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("write", lambda s: {"note": MARK, "log": ["w"]})
    builder.add_node("read", lambda s: {"log": [s["note"][:7]]})
    builder.add_edge(START, "write")
    builder.add_edge("write", "read")
    builder.add_edge("read", END)
    return builder.compile(checkpointer=saver)


def test_a_workers_write_is_stored_and_passed_on_without_encoding_again() -> None:
    serde = Counting()
    saver = InMemorySaver(serde=serde)
    executor = WireExecutor()
    out = (
        graph(saver)
        .with_executor(executor)
        .invoke({"log": []}, {"configurable": {"thread_id": "t"}})
    )
    assert out == {"note": MARK, "log": ["w", "written"]}
    # Neither the pending write nor the LastValue blob encoded the value again ...
    assert MARK not in serde.dumped
    # ... while the reducer's new values were encoded once per new version, by the loop: as
    # the items each appends to the version before (bulksync.checkpoint.appends).
    assert serde.dumped.count(["w"]) == serde.dumped.count(["written"]) == 1
    assert ["w", "written"] not in serde.dumped
    stored = saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert stored is not None and stored.checkpoint.channel_values["note"] == MARK
    # The next step's input carries the very bytes the worker made.
    note = executor.steps[-1].channel_values["note"]
    assert isinstance(note, Encoded) and note.data == MsgpackSerde().dumps(MARK)


class Fan(TypedDict):
    n: int
    out: Annotated[list[int], operator.add]


def test_a_steps_input_leaves_its_pending_sends_behind() -> None:
    builder = StateGraph(Fan)
    builder.add_node("work", lambda item: {"out": [item["i"]]})
    builder.add_node("count", lambda s: {"out": [len(s["out"])]})
    builder.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in range(s["n"])])
    # The branch reads the state where the task ran: from the step's input.
    builder.add_conditional_edges("work", lambda s: "count" if s["out"] else END)
    builder.add_edge("count", END)
    executor = WireExecutor()
    out = builder.compile().with_executor(executor).invoke({"n": 3, "out": []})
    assert out == builder.compile().invoke({"n": 3, "out": []}) == {"n": 3, "out": [0, 1, 2, 3]}
    # Each task has its own Send as its input: the step does not ship them all again.
    assert len(executor.steps) == 3
    assert all(TASKS not in step.channel_values for step in executor.steps)
