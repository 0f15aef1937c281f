"""What the HTTP API makes of the bodies LangGraph's clients send, and of the values it
answers with (no server: the pure parts of ``bulksync.service.api``)."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from bulksync.errors import ConfigError
from bulksync.service.api import encode
from bulksync.service.api.bodies import RunCreate, StateAt, thread_config
from bulksync.types import Command, Interrupt, PregelTask, Send, StateSnapshot


def body(**fields: Any) -> RunCreate:
    return RunCreate.model_validate({"assistant_id": "pkg.mod:graph", **fields})


def test_a_command_as_remote_graph_sends_it_resumes_with_no_goto() -> None:
    # RemoteGraph sends dataclasses.asdict(Command(resume=...)): goto is an empty list.
    value = body(command={"resume": {"id-1": "yes"}, "goto": []}).value()
    assert value == Command(resume={"id-1": "yes"})


def test_a_command_goto_may_name_nodes_or_sends() -> None:
    value = body(command={"goto": ["a", {"node": "b", "input": {"n": 1}}], "update": [["k", 2]]})
    command = value.value()
    assert command.goto == ("a", Send("b", {"n": 1})) and command.update == [("k", 2)]
    with pytest.raises(ConfigError, match="a Send needs 'node'"):
        body(command={"goto": {"input": {}}}).value()


def test_stream_modes_take_the_clients_names_and_refuse_unknown_ones() -> None:
    assert body(stream_mode=["values", "messages-tuple", "messages"]).modes() == [
        "values",
        "messages",
    ]
    assert body().modes() == ["values"]
    with pytest.raises(ConfigError, match="'events'"):
        body(stream_mode="events").modes()


@pytest.mark.parametrize(
    "fields",
    [
        {"webhook": "http://example.com"},
        {"after_seconds": 5},
        {"multitask_strategy": "interrupt"},
        {"durability": "later"},
        {"interrupt_before": "all"},
    ],
)
def test_fields_bulksync_does_not_act_on_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as raised:
        body(**fields)
    assert raised.value.errors()[0]["loc"][0] == next(iter(fields))


def test_the_payload_names_the_thread_and_checkpoint() -> None:
    payload = body(
        input={"x": 1},
        config={"configurable": {"user": "u"}, "recursion_limit": 7},
        checkpoint={"checkpoint_id": "c1", "thread_id": "other"},
        stream_subgraphs=True,
        metadata={"source": "test"},
    ).payload("t1", ["updates"])
    assert payload["input"] == {"x": 1} and payload["stream_mode"] == ["updates"]
    conf = payload["config"]["configurable"]
    assert (conf["thread_id"], conf["checkpoint_id"], conf["user"]) == ("t1", "c1", "u")
    assert payload["config"]["recursion_limit"] == 7
    assert payload["subgraphs"] is True and payload["metadata"] == {"source": "test"}


def test_a_checkpoint_reference_becomes_a_config() -> None:
    latest = thread_config("t1", StateAt().checkpoint)
    assert latest == {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    at = thread_config("t1", None, "c9")
    assert at["configurable"]["checkpoint_id"] == "c9"


@dataclasses.dataclass
class Point:
    x: int


class Color:
    def __repr__(self) -> str:
        return "Color(red)"


def test_values_become_json() -> None:
    when = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    ident = uuid.UUID(int=1)
    value = {
        "p": Point(1),
        "i": Interrupt("ok?", id="i1"),
        "s": {3},
        "t": (1, 2),
        "when": when,
        "id": ident,
        "err": ValueError("bad"),
        "nan": float("nan"),
        "other": Color(),
        5: b"raw",
    }
    assert encode.jsonable(value) == {
        "p": {"x": 1},
        "i": {"value": "ok?", "id": "i1"},
        "s": [3],
        "t": [1, 2],
        "when": when.isoformat(),
        "id": str(ident),
        "err": {"error": "ValueError", "message": "ValueError: bad"},
        "nan": "nan",
        "other": "Color(red)",
        "5": "raw",
    }


def test_a_snapshot_becomes_a_thread_state() -> None:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c2"}}
    parent = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    task = PregelTask("task-1", "ask", ("__pregel_pull", "ask"), interrupts=(Interrupt(1, "i"),))
    snapshot = StateSnapshot({"a": 1}, ("ask",), config, {"step": 1}, "now", parent, (task,))
    state = encode.thread_state(snapshot)
    assert state["checkpoint"] == {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c2"}
    assert state["parent_checkpoint"]["checkpoint_id"] == "c1"
    assert state["next"] == ["ask"] and state["metadata"] == {"step": 1}
    [shown] = state["tasks"]
    assert shown["interrupts"] == [{"value": 1, "id": "i"}] and shown["state"] is None
    assert encode.empty_state()["checkpoint"] is None
