"""Callbacks relayed from where a task runs to the caller's handlers: what a relay stands
for, each callback as a record that crosses the wire, replayed with the same runs, errors
with their type, values the wire cannot carry as text, and a failing handler kept apart."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManager

from bulksync.coordinator.executor import StepInput
from bulksync.workers import wire
from bulksync.workers.callback_relay import CALLBACK_EVENTS, describe, relay_manager, replay


class Recorder(BaseCallbackHandler):
    def __init__(self, *, fail: bool = False) -> None:
        self.seen: list[tuple[Any, ...]] = []
        self.fail = fail
        self.raise_error = fail

    def on_chain_start(self, serialized: Any, inputs: Any, **kw: Any) -> None:
        if self.fail:
            raise RuntimeError("tracer down")
        self.seen.append(("start", kw["name"], kw["run_id"], kw["parent_run_id"], inputs))

    def on_chain_end(self, outputs: Any, **kw: Any) -> None:
        self.seen.append(("end", kw["run_id"], outputs))

    def on_chain_error(self, error: BaseException, **kw: Any) -> None:
        self.seen.append(("error", kw["run_id"], error))


class Streaming(Recorder):
    """Follows streams, as ``astream_events``' handler does."""

    def tap_output_iter(self, run_id: Any, output: Iterator[Any]) -> Iterator[Any]:
        for chunk in output:
            self.seen.append(("chunk", run_id, chunk))
            yield chunk

    def tap_output_aiter(self, run_id: Any, output: Any) -> Any:
        return output


def relayed(trace: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A relay for ``trace`` whose records went through the wire as a worker sends them."""
    records: list[Any] = []

    def emit(record: Any) -> None:
        _, mode, chunk = wire.loads_event(wire.dumps_event(("ns",), CALLBACK_EVENTS, record))
        assert mode == CALLBACK_EVENTS
        records.append(chunk)

    return relay_manager(trace, emit), records


def test_nothing_to_relay_without_handlers() -> None:
    assert describe(None) is None
    assert describe([]) is None
    assert describe(CallbackManager(handlers=[])) is None


def test_a_relay_stands_for_the_parent_run_its_tags_and_metadata() -> None:
    parent = uuid.uuid4()
    manager = CallbackManager(
        handlers=[],
        inheritable_handlers=[Recorder()],
        parent_run_id=parent,
        inheritable_tags=["mine"],
        inheritable_metadata={"user": "ada", "lock": threading.Lock()},
    )
    trace = describe(manager)
    # A metadata value the wire cannot carry is left out rather than failing the step.
    assert trace == {
        "parent_run_id": parent,
        "tags": ["mine"],
        "metadata": {"user": "ada"},
        "streaming": False,
    }
    assert describe([Streaming()])["streaming"] is True  # type: ignore[index]


def test_replayed_callbacks_keep_their_runs_and_parents() -> None:
    parent = uuid.uuid4()
    relay, records = relayed({"parent_run_id": parent, "tags": ["mine"], "metadata": {}})
    run = relay.on_chain_start(None, {"x": 1}, name="node")
    run.on_chain_end({"x": 2})
    caller = Recorder()
    for record in records:
        replay([caller], record)
    assert caller.seen == [
        ("start", "node", run.run_id, parent, {"x": 1}),
        ("end", run.run_id, {"x": 2}),
    ]


def test_an_error_comes_back_with_its_type() -> None:
    relay, records = relayed({"parent_run_id": None})
    relay.on_chain_start(None, {}, name="node").on_chain_error(KeyError("missing"))
    caller = Recorder()
    for record in records:
        replay([caller], record)
    error = caller.seen[-1][2]
    assert isinstance(error, KeyError) and error.args == ("missing",)


def test_a_value_the_wire_cannot_carry_arrives_as_its_repr() -> None:
    relay, records = relayed({"parent_run_id": None})
    lock = threading.Lock()
    relay.on_chain_start(None, {"lock": lock, "n": 1}, name="node")
    caller = Recorder()
    replay([caller], records[0])
    assert caller.seen[0][4] == {"lock": repr(lock), "n": 1}


def test_run_ids_are_renamed_to_the_callers() -> None:
    cluster, own = uuid.uuid4(), uuid.uuid4()
    relay, records = relayed({"parent_run_id": str(cluster)})
    run = relay.on_chain_start(None, {}, name="node")
    caller = Recorder()
    replay([caller], records[0], rename={str(cluster): own})
    assert caller.seen == [("start", "node", run.run_id, own, {})]


def test_a_streaming_relay_forwards_chunks_to_streaming_handlers() -> None:
    relay, records = relayed({"parent_run_id": None, "streaming": True})
    run = relay.on_chain_start(None, {}, name="node")
    (handler,) = relay.handlers
    assert list(handler.tap_output_iter(run.run_id, iter(["a", "b"]))) == ["a", "b"]
    plain, streaming = Recorder(), Streaming()
    for record in records:
        replay(CallbackManager(handlers=[], inheritable_handlers=[plain, streaming]), record)
    assert [s[0] for s in plain.seen] == ["start"]
    assert streaming.seen[1:] == [("chunk", run.run_id, "a"), ("chunk", run.run_id, "b")]


def test_a_plain_relay_does_not_make_models_stream() -> None:
    relay, _ = relayed({"parent_run_id": None, "streaming": False})
    (handler,) = relay.handlers
    assert not hasattr(handler, "tap_output_iter")


def test_a_failing_handler_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    relay, records = relayed({"parent_run_id": None})
    relay.on_chain_start(None, {}, name="node")
    other = Recorder()
    with caplog.at_level(logging.WARNING):
        replay([Recorder(fail=True), other], records[0])
    assert "relayed on_chain_start" in caplog.text
    assert other.seen == []  # LangChain stops at a raise_error handler, as it would locally


def test_a_step_carries_its_runs_callbacks_to_workers() -> None:
    parent = uuid.uuid4()
    manager = CallbackManager(handlers=[], inheritable_handlers=[Recorder()], parent_run_id=parent)
    step = StepInput({}, {"callbacks": manager}, 3, {}, None, None, ())
    decoded = wire.loads_state(wire.dumps_state(step))
    assert "callbacks" not in decoded.config
    assert decoded.trace is not None and decoded.trace["parent_run_id"] == parent
    assert (
        wire.loads_state(wire.dumps_state(StepInput({}, {}, 3, {}, None, None, ()))).trace is None
    )
