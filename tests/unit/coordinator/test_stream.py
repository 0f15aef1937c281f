"""Stream modes: one list, declared as ``types.StreamMode``, accepted exactly by the parsers;
``PAUSES``, bulksync's own, which lets ``invoke`` read the interrupts of a run without a
chunk built per task; and ``TASK_STEPS``, the coordinator service's count of a run's tasks
without a checkpoint payload built per step."""

from __future__ import annotations

from typing import Any, TypedDict, get_args

import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.cli import build_parser
from bulksync.coordinator import stream
from bulksync.coordinator.stream import ALL_MODES, PAUSES, TASK_STEPS, check_modes, stream_modes
from bulksync.errors import ConfigError
from bulksync.graph import START, StateGraph
from bulksync.types import StreamMode, interrupt

NOT_MODES = ("events", "Values", "value", "values ", "tool")
"""Names near the real ones (and one DESIGN.md plans) that no parser may accept yet."""


def test_the_list_is_the_stream_mode_literal() -> None:
    assert get_args(StreamMode) == ALL_MODES
    assert len(set(ALL_MODES)) == len(ALL_MODES)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_mode_is_accepted(mode: str) -> None:
    assert stream_modes(mode, False) == ([mode], True)
    check_modes([mode])
    args = build_parser().parse_args(["submit", "g:graph", "--input", "{}", "--stream-mode", mode])
    assert args.stream_mode == mode


def test_all_modes_together_are_accepted() -> None:
    assert stream_modes(list(ALL_MODES), False) == (list(ALL_MODES), False)


@pytest.mark.parametrize("mode", NOT_MODES)
def test_nothing_else_is_accepted(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="Unknown stream_mode"):
        stream_modes(mode, False)
    with pytest.raises(ConfigError, match="Unknown stream_mode"):
        stream_modes(["values", mode], False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "g:graph", "--input", "{}", "--stream-mode", mode])
    assert "invalid choice" in capsys.readouterr().err


class Count(TypedDict):
    n: int


def two_steps(*, pause: bool = False) -> Any:
    def add(state: Count) -> dict[str, int]:
        if pause:
            interrupt("why")
        return {"n": state["n"] + 1}

    builder = StateGraph(Count)
    builder.add_node("a", add)
    builder.add_node("b", add)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    return builder.compile(checkpointer=InMemorySaver())


def test_pauses_is_bulksyncs_own_mode() -> None:
    assert PAUSES not in ALL_MODES
    check_modes([PAUSES, "values"])  # invoke's
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "g:graph", "--input", "{}", "--stream-mode", PAUSES])


def test_task_steps_are_the_debug_events_of_tasks_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TASK_STEPS not in ALL_MODES
    built: list[Any] = []
    real = stream.checkpoint_payload
    monkeypatch.setattr(
        stream, "checkpoint_payload", lambda *a, **k: built.append(a) or real(*a, **k)
    )

    def events(thread: str, mode: str) -> list[tuple[str, int, str]]:
        config = {"configurable": {"thread_id": thread}}
        chunks = [c for _, c in two_steps().stream({"n": 0}, config, stream_mode=[mode])]
        return [(c["type"], c["step"], c["payload"].get("name")) for c in chunks]

    tasks = events("t", TASK_STEPS)
    assert built == []  # no checkpoint payload for them
    assert tasks == [
        ("task", 1, "a"),
        ("task_result", 1, "a"),
        ("task", 2, "b"),
        ("task_result", 2, "b"),
    ]
    debug = events("u", "debug")
    assert [e for e in debug if e[0] != "checkpoint"] == tasks
    assert built


def test_invoke_builds_no_update_of_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    real = stream.update_chunk
    monkeypatch.setattr(stream, "update_chunk", lambda *a, **k: built.append(a) or real(*a, **k))
    config = {"configurable": {"thread_id": "t"}}
    assert two_steps().invoke({"n": 0}, config) == {"n": 2}
    assert built == []
    assert [c for c in two_steps().stream({"n": 0}, config)] == [{"a": {"n": 1}}, {"b": {"n": 2}}]
    assert len(built) == 2


def test_invoke_still_returns_the_interrupts_of_a_pause() -> None:
    config = {"configurable": {"thread_id": "t"}}
    out = two_steps(pause=True).invoke({"n": 0}, config)
    assert out["n"] == 0 and [i.value for i in out["__interrupt__"]] == ["why"]
