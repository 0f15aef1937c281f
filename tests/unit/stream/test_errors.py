"""Bad input to ``stream_events`` and its transformers gets a clear error and runs nothing."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

from bulksync.graph import START, StateGraph
from bulksync.stream import StreamChannel, StreamTransformer


class State(TypedDict):
    value: int


def _graph(calls: list[int], **compile_kw: Any) -> Any:
    def bump(state: State) -> dict[str, Any]:
        calls.append(state["value"])
        return {"value": state["value"] + 1}

    b = StateGraph(State)
    b.add_node("bump", bump)
    b.add_edge(START, "bump")
    return b.compile(**compile_kw)


class Counting(StreamTransformer):
    required_stream_modes = ("values",)

    def init(self) -> dict[str, Any]:
        return {"counted": StreamChannel()}

    def process(self, event: Any) -> bool:
        return True


class AsyncOnly(Counting):
    async def aprocess(self, event: Any) -> bool:
        return True


class SameKey(Counting):
    def init(self) -> dict[str, Any]:
        return {"values": StreamChannel()}


class NotADict(Counting):
    def init(self) -> Any:
        return ["values"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"stream_mode": "values"}, TypeError, "stream_mode"),
        ({"subgraphs": True}, TypeError, "subgraphs"),
        ({"transformers": [Counting()]}, TypeError, "pre-built instance Counting"),
        ({"transformers": ["values"]}, TypeError, "scope-aware callables, got str"),
        ({"transformers": [AsyncOnly]}, RuntimeError, "AsyncOnly requires an async run"),
        ({"transformers": [SameKey]}, ValueError, "'values' \\(owned by ValuesTransformer\\)"),
        ({"transformers": [NotADict]}, TypeError, "must return a dict, got list"),
    ],
)
def test_bad_v3_arguments_name_the_problem_and_run_nothing(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    calls: list[int] = []
    with pytest.raises(error, match=match):
        _graph(calls).stream_events({"value": 1}, version="v3", **kwargs)
    assert calls == []


def test_a_transformer_instance_at_compile_time_is_refused() -> None:
    with pytest.raises(TypeError, match=r"compile\(\) transformers .* pre-built instance"):
        _graph([], transformers=[Counting()])


def test_compile_time_transformers_join_every_run() -> None:
    run = _graph([], transformers=[Counting]).stream_events({"value": 1}, version="v3")
    assert "counted" in run.extensions
    assert run.output == {"value": 2}


def test_sync_event_streams_other_than_v3_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="astream_events\\(version='v2'\\)"):
        _graph([]).stream_events({"value": 1}, version="v2")


def test_an_async_only_transformer_runs_on_the_async_lane() -> None:
    async def main() -> Any:
        run = await _graph([]).astream_events({"value": 1}, version="v3", transformers=[AsyncOnly])
        return await run.output()

    assert asyncio.run(main()) == {"value": 2}


def test_a_projection_has_one_reader() -> None:
    run = _graph([]).stream_events({"value": 1}, version="v3")
    iter(run.values)
    with pytest.raises(RuntimeError, match=r"already has a subscriber; use \.tee"):
        iter(run.values)
    with pytest.raises(AttributeError, match="registered projections: lifecycle, messages"):
        run.nope  # noqa: B018


def test_a_run_that_fails_fails_every_reader() -> None:
    def broken(state: State) -> dict[str, Any]:
        raise ValueError("broke")

    b = StateGraph(State)
    b.add_node("broken", broken)
    b.add_edge(START, "broken")
    run = b.compile().stream_events({"value": 1}, version="v3")
    values = iter(run.values)
    with pytest.raises(ValueError, match="broke"):
        list(values)
    with pytest.raises(ValueError, match="broke"):
        run.output  # noqa: B018
