"""What crosses between coordinator and workers: step states, task descriptors, results, errors.

Descriptors travel inside Celery messages, which kombu packs with plain msgpack (tuples come
back as lists); everything else goes through the checkpoint serde. Each round trip here goes
through the same encoder the cluster uses.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from typing import Any

import msgpack
import pytest

from bulksync.channels.base import MISSING
from bulksync.checkpoint.base import Encoded
from bulksync.constants import PULL, PUSH, RESUME, TASKS
from bulksync.coordinator.executor import Nesting, StepInput, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.errors import (
    InvalidUpdateError,
    SerializationError,
    StoredError,
    TaskCancelledError,
    TaskError,
    TaskTimeoutError,
    is_invalid_resume,
    mark_invalid_resume,
)
from bulksync.types import Command, Interrupt, Send
from bulksync.workers import wire


class Opaque:
    """A value the wire cannot encode."""


class NeedsTwo(Exception):
    """An error whose constructor wants two arguments."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


class Custom(Exception):
    """A user error defined in a loaded module."""


def kombu_trip(value: Any) -> Any:
    """What a Celery message body becomes after kombu's msgpack serializer."""
    return msgpack.unpackb(msgpack.packb(value), raw=False)


def task(**kw: Any) -> Task:
    fields: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "name": "work",
        "path": (PUSH, 3),
        "input": {"i": 3},
        "triggers": (PUSH,),
        "step": 2,
        "checkpoint_ns": "work:abc",
    }
    fields.update(kw)
    return Task(**fields)


# -- step state --------------------------------------------------------------------------


def test_step_state_round_trips() -> None:
    when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC)
    state = StepInput(
        channel_values={"log": ["a", ("t", 1)], "tags": {"x", "y"}, "when": when},
        config={"configurable": {"thread_id": "t1"}, "recursion_limit": 25, "run_id": "r1"},
        stop=27,
        resume={"task-1": ["yes", {"n": 1}]},
        resume_map={"0123abcd": "answer"},
        null_resume="go",
        namespace=("parent:1", "child:2"),
        nesting=Nesting(
            recursion_limit=25,
            durability="sync",
            modes=("custom", "updates"),
            resuming=True,
            checkpoint_map={"": "cp-1", "parent:1": "cp-2"},
            subgraphs=True,
        ),
    )
    assert wire.loads_state(wire.dumps_state(state)) == state


def test_step_state_carries_node_failures_as_stored_errors() -> None:
    state = StepInput({}, {}, 1, {}, None, None, (), node_errors={"t1": ["n", KeyError("x")]})
    node, error = wire.loads_state(wire.dumps_state(state)).node_errors["t1"]
    assert node == "n"
    assert isinstance(error, StoredError)
    assert (error.type_name, error.message) == ("builtins.KeyError", "'x'")


def test_step_state_of_an_older_coordinator_reads_subgraphs_as_false() -> None:
    """A step stored before nesting carried ``subgraphs``: its five fields still decode."""
    nesting = Nesting(25, "async", ("updates",), False, {}, subgraphs=True)
    fields = wire.SERDE.loads(wire.dumps_state(StepInput({}, {}, 1, {}, None, None, (), nesting)))
    fields[7] = fields[7][:5]
    decoded = wire.loads_state(wire.SERDE.dumps(fields)).nesting
    assert decoded == dataclasses.replace(nesting, subgraphs=False)


def test_step_state_keeps_only_the_config_a_node_can_use() -> None:
    config = {
        "configurable": {"thread_id": "t1"},
        "tags": ["a"],
        "callbacks": [Opaque()],  # live objects stay in the coordinator
        "max_concurrency": 4,
    }
    state = StepInput({}, config, 1, {}, None, None, ())
    assert wire.loads_state(wire.dumps_state(state)).config == {
        "configurable": {"thread_id": "t1"},
        "tags": ["a"],
    }


def test_unencodable_state_names_the_channel() -> None:
    state = StepInput({"ok": 1, "bad": Opaque()}, {}, 1, {}, None, None, ())
    with pytest.raises(SerializationError, match=r"\(step state\).*channel 'bad'.*Opaque"):
        wire.dumps_state(state)


def test_unencodable_config_names_the_key() -> None:
    state = StepInput({}, {"metadata": {"who": Opaque()}}, 1, {}, None, None, ())
    with pytest.raises(SerializationError, match=r"\(run config\).*'metadata'"):
        wire.dumps_state(state)


# -- task descriptors and inputs ---------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        (PULL, "work"),
        (PUSH, 7),
        (PUSH, (PULL, "plan"), 2, True),  # a Send from a PULL task's writes
        (PUSH, (PUSH, (PULL, "a"), 0, False), 1, True),  # nested twice
    ],
)
def test_task_descriptor_round_trips_through_a_celery_message(path: tuple[Any, ...]) -> None:
    original = task(path=path, triggers=(PUSH, "branch:to:work"))
    desc = wire.TaskDescriptor.unpack(
        kombu_trip(wire.TaskDescriptor.of(original, original.id).pack())
    )
    value = wire.loads_input(wire.dumps_input(original.input, original))
    assert desc.task(value) == original
    assert isinstance(desc.task(value).path, tuple)


def test_batched_and_single_descriptors_round_trip_by_name() -> None:
    descs = [wire.TaskDescriptor.of(task(path=(PUSH, i)), f"slot-{i}") for i in range(3)]
    assert wire.loads_descs(wire.dumps_descs(descs)) == descs
    assert wire.loads_descriptor(wire.dumps_descriptor(descs[1])).slot == "slot-1"


def test_descriptor_carries_no_input() -> None:
    big = task(input={"big": "s" * 100_000})
    desc = wire.TaskDescriptor.of(big, big.id).pack()
    assert "sss" not in repr(desc)
    assert len(msgpack.packb(desc)) < 300


def step_state(**kw: Any) -> StepInput:
    fields: dict[str, Any] = {
        "channel_values": {},
        "config": {},
        "stop": 3,
        "resume": {},
        "resume_map": None,
        "null_resume": None,
        "namespace": (),
    }
    fields.update(kw)
    return StepInput(**fields)


def test_result_slot_is_the_task_id_when_the_task_has_no_answers() -> None:
    assert wire.slot("t1", step_state(resume={"other": ["x"]})) == "t1"


@pytest.mark.parametrize(
    "answers",
    [
        {"resume": {"t1": ["yes"]}},
        {"resume_map": {"abc": "yes"}},
        {"null_resume": "yes"},
    ],
)
def test_result_slot_of_a_resumed_task_depends_on_its_answers(answers: dict[str, Any]) -> None:
    slot = wire.slot("t1", step_state(**answers))
    assert slot.startswith("t1:") and slot != "t1"
    assert wire.slot("t1", step_state(**answers)) == slot  # a pure function of the answers
    other = {k: ({"t1": ["no"]} if k == "resume" else "no") for k in answers}
    assert wire.slot("t1", step_state(**other)) != slot


def test_missing_input_round_trips() -> None:
    assert wire.loads_input(wire.dumps_input(MISSING, task())) is MISSING
    assert wire.loads_input(None) is MISSING
    assert wire.loads_input(wire.dumps_input(None, task())) is None


def test_unencodable_input_names_the_node() -> None:
    with pytest.raises(SerializationError, match=r"node 'work'.*task input.*Opaque"):
        wire.dumps_input({"x": Opaque()}, task())


# -- results ---------------------------------------------------------------------------


def test_result_with_sends_commands_and_interrupts_round_trips() -> None:
    result = TaskResult(
        "task-1",
        writes=(
            ("log", ["done", ("tuple", 1)]),
            (TASKS, Send("work", {"i": 1, "when": datetime.date(2024, 1, 2)})),
            ("branch:to:next", None),
            ("cmd", Command(graph=Command.PARENT, update={"a": 1}, goto=[Send("x", 2), "y"])),
        ),
        interrupts=(Interrupt({"question": "ok?"}, id="abc123"),),
    )
    back = wire.loads_result(wire.dumps_result(result, "work"))
    assert back == result


def test_empty_result_round_trips() -> None:
    result = TaskResult("task-2")
    assert wire.loads_result(wire.dumps_result(result, "work")) == result


def test_a_taken_null_resume_travels_with_the_result() -> None:
    result = TaskResult("task-2", writes=((RESUME, ["yes"]),), took_null_resume=True)
    assert wire.loads_result(wire.dumps_result(result, "ask")).took_null_resume


def test_a_result_from_an_older_worker_took_no_null_resume() -> None:
    old = wire.SERDE.dumps(["task-2", [], None, []])  # four fields, before the flag
    assert wire.loads_result(old) == TaskResult("task-2")


def test_unencodable_write_becomes_a_serialization_error_naming_node_and_channel() -> None:
    result = TaskResult("task-3", writes=(("fine", 1), ("note", Opaque())))
    back = wire.loads_result(wire.dumps_result(result, "leaky"))
    assert back.writes == ()
    assert isinstance(back.error, SerializationError)
    assert "node 'leaky'" in str(back.error) and "channel 'note'" in str(back.error)
    assert "Opaque" in str(back.error)


def test_unencodable_interrupt_value_is_named() -> None:
    result = TaskResult("task-4", interrupts=(Interrupt(Opaque(), id="i1"),))
    back = wire.loads_result(wire.dumps_result(result, "asker"))
    assert isinstance(back.error, SerializationError)
    assert "node 'asker'" in str(back.error) and "interrupt value" in str(back.error)


# -- errors ------------------------------------------------------------------------------


def error_trip(error: BaseException) -> BaseException:
    try:  # raised, so that the record carries a real traceback
        raise error
    except BaseException as exc:
        result = TaskResult("task-e", error=exc)
    back = wire.loads_result(wire.dumps_result(result, "node")).error
    assert back is not None
    return back


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad value 42"),
        KeyError("missing"),
        TaskTimeoutError("node 'slow': too long"),
        InvalidUpdateError("two values for 'x'"),
        Custom("user error"),
    ],
)
def test_errors_keep_their_type_and_message(error: BaseException) -> None:
    back = error_trip(error)
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    assert any("Traceback" in n and "in error_trip" in n for n in back.__notes__)


def test_error_of_a_class_not_loaded_here_arrives_as_stored_error() -> None:
    class Elsewhere(Exception):
        pass

    Elsewhere.__module__ = "bulksync_tests_not_imported_module"
    assert Elsewhere.__module__ not in sys.modules
    back = error_trip(Elsewhere("from far away"))
    assert isinstance(back, StoredError)
    assert back.type_name.startswith("bulksync_tests_not_imported_module.")
    assert back.type_name.endswith(".Elsewhere")
    assert back.message == "from far away"
    assert any("Traceback" in n for n in back.__notes__)


def test_error_whose_constructor_refuses_its_args_keeps_its_name() -> None:
    back = error_trip(NeedsTwo(7, "broken"))  # its args are ("7: broken",): one too few
    assert isinstance(back, StoredError)
    assert back.type_name.endswith(".NeedsTwo")
    assert str(back) == "7: broken"


def test_error_with_unencodable_args_keeps_its_message() -> None:
    back = error_trip(ValueError(Opaque()))
    assert type(back) is ValueError
    assert "Opaque" in str(back)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (TaskTimeoutError("slow"), True),  # the class defaults
        (TaskCancelledError("stop"), False),
        (TaskTimeoutError("slow", retryable=False), False),  # an instance's own flag
        (TaskCancelledError("stop", retryable=True), True),
    ],
)
def test_task_errors_keep_their_retryable_flag(error: TaskError, retryable: bool) -> None:
    back = error_trip(error)
    assert type(back) is type(error)
    assert isinstance(back, TaskError) and back.retryable is retryable
    again = wire.loads_error(wire.dumps_error(error))
    assert isinstance(again, TaskError) and again.retryable is retryable


def test_task_error_of_a_class_not_loaded_here_keeps_its_retryable_flag() -> None:
    class FarTaskError(TaskError):
        retryable = True

    FarTaskError.__module__ = "bulksync_tests_not_imported_module"
    back = error_trip(FarTaskError("try again"))
    assert isinstance(back, StoredError) and back.type_name.endswith(".FarTaskError")
    assert back.retryable is True
    back = error_trip(FarTaskError("not this time", retryable=False))
    assert isinstance(back, StoredError) and back.retryable is False


def test_stored_error_sent_on_keeps_the_original_name_and_flag() -> None:
    stored = StoredError("far.module.Boom", "boom", "Boom('boom')", retryable=True)
    back = error_trip(stored)
    assert isinstance(back, StoredError)
    assert (back.type_name, back.message, repr(back)) == ("far.module.Boom", "boom", "Boom('boom')")
    assert back.retryable is True


def test_error_record_written_before_the_retryable_flag_still_decodes() -> None:
    # Six fields, as runs finished by an older version keep them in Postgres.
    old = ["builtins:ValueError", "builtins.ValueError", ["old"], "old", "ValueError('old')", ""]
    back = wire.loads_error(wire.SERDE.dumps(old))
    assert type(back) is ValueError and str(back) == "old"
    gone = wire.loads_error(wire.SERDE.dumps(["bulksync_tests_not_imported_module:Gone", *old[1:]]))
    assert isinstance(gone, StoredError) and gone.retryable is False


# -- custom events -----------------------------------------------------------------------


def test_stream_event_round_trips() -> None:
    chunk = {"progress": 3, "at": datetime.time(1, 2), "ids": (1, 2)}
    data = wire.dumps_event(("parent:1", "child:2"), "custom", chunk)
    assert wire.loads_event(data) == (("parent:1", "child:2"), "custom", chunk)


def test_unencodable_custom_event_is_refused() -> None:
    with pytest.raises(SerializationError, match="Opaque"):
        wire.dumps_event((), "custom", {"x": Opaque()})


# -- values encoded once -----------------------------------------------------------------


def test_result_write_values_arrive_as_the_workers_bytes() -> None:
    back = wire.loads_result(wire.dumps_result(TaskResult("t", writes=(("a", (1, "x")),)), "n"))
    chan, value = back.writes[0]
    assert chan == "a" and isinstance(value, Encoded)
    assert value.data == wire.SERDE.dumps((1, "x")) and value.value == (1, "x")


class Foreign:
    """A serde of another format."""

    def dumps(self, value: Any) -> bytes:
        return b"foreign"

    def loads(self, data: bytes) -> Any:
        return "from foreign"


def test_step_input_ships_known_bytes_as_they_are() -> None:
    known = Encoded(wire.SERDE.dumps(["kept"]), wire.SERDE)
    foreign = Encoded(b"foreign", Foreign())
    data = wire.dumps_state(step_state(channel_values={"k": known, "f": foreign, "p": 1}))
    values = wire.loads_state(data).channel_values
    assert values == {"k": ["kept"], "f": "from foreign", "p": 1}
    assert values["k"].data == known.data
    assert values["f"].data == wire.SERDE.dumps("from foreign")  # encoded from its value


def test_a_pydantic_validation_error_crosses_as_itself() -> None:
    import pydantic

    class Answer(pydantic.BaseModel):
        age: int

    try:
        Answer.model_validate({"age": "old"})
    except pydantic.ValidationError as exc:
        error = exc
    back = wire.loads_result(wire.dumps_result(TaskResult("t", error=error), "ask")).error
    assert isinstance(back, pydantic.ValidationError)
    assert back.errors(include_url=False) == error.errors(include_url=False)
    assert not is_invalid_resume(back)
    marked = wire.loads_error(wire.dumps_error(mark_invalid_resume(error)))
    assert is_invalid_resume(marked) and isinstance(marked, pydantic.ValidationError)
    plain = wire.loads_error(wire.dumps_error(mark_invalid_resume(ValueError("no"))))
    assert is_invalid_resume(plain)  # the mark travels without validation details too


def test_the_error_handler_a_result_came_from_crosses_the_wire() -> None:
    result = TaskResult("t1", (("x", 1),), handled_by="__error_handler__fetch")
    assert wire.loads_result(wire.dumps_result(result, "fetch")).handled_by == (
        "__error_handler__fetch"
    )


def test_live_objects_in_a_handed_on_config_stay_in_the_process() -> None:
    config = {"configurable": {"thread_id": "t", "__pregel_runtime": object()}}
    step = StepInput({}, config, 3, {}, None, None, ())
    assert wire.loads_state(wire.dumps_state(step)).config == {"configurable": {"thread_id": "t"}}
