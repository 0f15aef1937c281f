"""A worker that cannot read what a task carries fails the task at once, with why.

A value whose type lives in a module the worker never imported (the caller's, say) cannot be
decoded there: bulksync never imports modules named by stored data. The task then fails with
that ``SerializationError`` (which names the type and the fix) and a note naming the task,
as a node's failure would, and the worker logs it. Before, the worker's claim was left to
expire, the task was delivered again until its deliveries ran out, and the run failed with
a ``WorkerLostError`` that blamed a dying process. The other way round (a node's value of a
type only the worker imported), the loop's process fails the run, noted with the node.

The worker is a real ``bulksync worker`` subprocess serving a module written to a temporary
directory; the types module sits beside it, imported by this process only.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bulksync.errors import SerializationError
from bulksync.settings import Settings
from bulksync.types import Command, Send
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.executor import CeleryExecutor
from tests.integration.test_worker_process import (
    WorkerProcess,
    start_worker,
    stop,
    wait_ready,
    worker_env,
    write_graph_module,
)

pytestmark = pytest.mark.integration

WAIT = 30.0
"""Longest a test waits for the worker's log line (a liveness bound, not a measure)."""

TYPES_MODULE = """
import dataclasses


@dataclasses.dataclass
class Payload:
    n: int
"""

GRAPH_MODULE = '''
"""Graphs whose tasks carry a value of a type this worker never imports."""

import importlib
import operator
from typing import Annotated, Any, TypedDict

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.graph import END, START, StateGraph
from bulksync.types import Send


class State(TypedDict, total=False):
    item: Any
    out: Annotated[list, operator.add]


class Context(TypedDict, total=False):
    who: Any


def route(state: State) -> list:
    return [Send("work", {"item": state.get("item")})]


def work(arg: dict) -> dict:
    return {"out": [repr(arg["item"])]}


async def awork(arg: dict) -> dict:
    return {"out": [repr(arg["item"])]}


def read(state: State) -> dict:
    return {"out": [repr(state["item"])]}


def greet(state: State, runtime: Any) -> dict:
    return {"out": [repr(runtime.context)]}


def make(state: State) -> dict:
    # Imported here, on the worker only: the process that runs the loop never imports it.
    made = importlib.import_module(__name__ + "_made")
    return {"item": made.Made(3)}


def fanning(node: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("work", node)
    builder.add_conditional_edges(START, route, ["work"])
    builder.add_edge("work", END)
    return builder.compile(checkpointer=InMemorySaver())


sends = fanning(work)
async_sends = fanning(awork)

builder = StateGraph(State)
builder.add_node("read", read)
builder.add_edge(START, "read")
builder.add_edge("read", END)
reads = builder.compile()

builder = StateGraph(State, context_schema=Context)
builder.add_node("greet", greet)
builder.add_edge(START, "greet")
builder.add_edge("greet", END)
with_context = builder.compile()

builder = StateGraph(State)
builder.add_node("make", make)
builder.add_edge(START, "make")
builder.add_edge("make", END)
makes = builder.compile()
'''

MADE_MODULE = """
import dataclasses


@dataclasses.dataclass
class Made:
    n: int
"""

GRAPHS = ("sends", "async_sends", "reads", "with_context", "makes")


@dataclasses.dataclass
class Fleet:
    worker: WorkerProcess
    payload: type


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("graphs")
    name = write_graph_module(directory, GRAPH_MODULE)
    types_name = f"{name}_types"
    (directory / f"{types_name}.py").write_text(TYPES_MODULE)
    (directory / f"{name}_made.py").write_text(MADE_MODULE)  # imported by the worker only
    sys.path.insert(0, str(directory))
    module = importlib.import_module(name)
    types = importlib.import_module(types_name)  # here only: the graph module never imports it
    queue = f"bulksync-test-unreadable-{uuid.uuid4().hex[:8]}"
    env = worker_env(directory, settings, queue)
    settings = dataclasses.replace(settings, queue=queue)
    worker = start_worker(directory, module, settings, env, f"{queue}@localhost", GRAPHS)
    try:
        wait_ready(make_app(settings), worker)
        yield Fleet(worker, types.Payload)
    finally:
        stop(worker)
        sys.path.remove(str(directory))
        sys.modules.pop(name, None)
        sys.modules.pop(types_name, None)


@pytest.mark.parametrize(
    ("graph_name", "node", "carried_by"),
    [
        ("sends", "work", "a Send's payload"),
        ("async_sends", "work", "a Send's payload to an async node"),
        ("reads", "read", "the state a node reads"),
        ("with_context", "greet", "the run's context"),
    ],
)
def test_a_value_the_worker_cannot_read_fails_its_task_at_once(
    fleet: Fleet, graph_name: str, node: str, carried_by: str
) -> None:
    worker = fleet.worker
    graph = getattr(worker.module, graph_name)
    value = fleet.payload(3)
    given: dict[str, Any] = {}
    state: Any = {"item": value}
    if graph_name == "with_context":
        state, given = {"item": 1}, {"context": {"who": value}}
    logged = len(worker.output())
    graph_id = f"{worker.module.__name__}:{graph_name}"
    with CeleryExecutor(worker.settings, graph_id, graph) as executor:
        attached = graph.with_executor(executor)
        if node == "work":
            # The caller's own Send to a thread that has a state: only the Send's payload
            # carries the value (on a new thread a Command is START's input too).
            config = {"configurable": {"thread_id": uuid.uuid4().hex}}
            assert attached.invoke({"item": 1}, config)["out"] == ["1"]
            state, given = Command(goto=[Send("work", {"item": value})]), {"config": config}
        with pytest.raises(SerializationError, match="is not imported in this process") as info:
            attached.invoke(state, **given)
    assert "Payload" in str(info.value), carried_by
    assert f"'{node}'" in "\n".join(getattr(info.value, "__notes__", [])), carried_by
    # The worker says so in its log too, where operators look.
    assert logs(worker, logged, "is not imported in this process"), carried_by


def logs(worker: WorkerProcess, start: int, text: str) -> bool:
    """Whether the worker's log has ``text`` past offset ``start``. A worker logs a failure
    after reporting it, so this looks again for up to ``WAIT`` s (a liveness bound)."""
    deadline = time.monotonic() + WAIT
    while text not in worker.output()[start:]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_value_only_the_worker_can_read_fails_the_run_naming_its_node(fleet: Fleet) -> None:
    """The other way round: a node returns a value of a type only the worker imported. The
    loop's process cannot read the task's writes; the run fails with the same error, noted
    with the node that wrote them."""
    worker = fleet.worker
    graph = worker.module.makes
    with (
        CeleryExecutor(worker.settings, f"{worker.module.__name__}:makes", graph) as executor,
        pytest.raises(SerializationError, match="is not imported in this process") as info,
    ):
        graph.with_executor(executor).invoke({"item": 1})
    assert "_made:Made" in str(info.value)
    assert "During task with name 'make'" in "\n".join(getattr(info.value, "__notes__", []))


def test_the_same_values_run_where_the_type_is_known(fleet: Fleet) -> None:
    """The failure is the worker's missing import, nothing else: a value of a type every
    process knows goes through the same graph."""
    worker = fleet.worker
    graph = worker.module.sends
    with CeleryExecutor(worker.settings, f"{worker.module.__name__}:sends", graph) as executor:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = graph.with_executor(executor).invoke({"item": {"n": 3}}, config)
    assert out["out"] == [repr({"n": 3})]
