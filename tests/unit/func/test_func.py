"""``bulksync.func``: how the decorators reject bad use, and what a call leaves behind."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.coordinator.executor import CallRecord, StepInput, TaskResult
from bulksync.func import entrypoint, task
from bulksync.types import RetryPolicy
from bulksync.warnings import LangGraphDeprecatedSinceV05, LangGraphDeprecatedSinceV10
from bulksync.workers import wire


def test_a_task_called_outside_a_graph_says_where_it_can_be_called() -> None:
    @task
    def double(x: int) -> int:
        return 2 * x

    with pytest.raises(RuntimeError, match=r"@task 'double' outside a running graph"):
        double(1)


def test_an_entrypoint_needs_an_input_parameter() -> None:
    def nothing() -> None:
        return None

    with pytest.raises(ValueError, match="at least one parameter"):
        entrypoint()(nothing)


def test_generators_are_not_entrypoints() -> None:
    def gen(x: int) -> Any:
        yield x

    with pytest.raises(NotImplementedError, match="Generators"):
        entrypoint()(gen)


def test_final_needs_both_types() -> None:
    def half(x: int) -> entrypoint.final[int]:  # type: ignore[type-arg]
        return entrypoint.final(value=x, save=x)

    with pytest.raises(TypeError, match=r"final"):  # Python's own: too few type arguments
        entrypoint()(half)


def test_unknown_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="retries"):
        task(retries=3)
    with pytest.raises(TypeError, match="saver"):
        entrypoint(saver=InMemorySaver())


def test_renamed_arguments_warn_and_still_work() -> None:
    policy = RetryPolicy(max_attempts=2)
    with pytest.warns(LangGraphDeprecatedSinceV05):
        decorated = task(retry=policy)(lambda x: x)
    assert decorated.retry_policy == (policy,)
    with pytest.warns(LangGraphDeprecatedSinceV10):
        made = entrypoint(config_schema=dict)
    assert made.context_schema is dict


def test_task_names_come_from_the_function_or_the_argument() -> None:
    def fetch(x: int) -> int:
        return x

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert task(fetch).name == "fetch"
        assert task(name="get")(fetch).name == "get"


def test_an_entrypoint_returns_its_output_and_saves_the_rest() -> None:
    @entrypoint(checkpointer=InMemorySaver())
    def count(item: str, *, previous: Any = None) -> entrypoint.final[int, list[str]]:
        seen = previous or []
        return entrypoint.final(value=len(seen), save=[*seen, item])

    thread = {"configurable": {"thread_id": "t"}}
    assert [count.invoke(x, thread) for x in "abc"] == [0, 1, 2]
    assert count.get_state(thread).values == 2


def test_calls_and_returns_cross_the_wire() -> None:
    call = CallRecord("c1", "fetch", "~p", (("__return__", {"n": 1}), ("__resume__", ["yes"])))
    result = wire.loads_result(wire.dumps_result(TaskResult("t1", calls=(call,)), "node"))
    (back,) = result.calls
    assert (back.task_id, back.name, back.path) == ("c1", "fetch", "~p")
    assert [(c, v.value if hasattr(v, "value") else v) for c, v in back.writes] == [
        ("__return__", {"n": 1}),
        ("__resume__", ["yes"]),
    ]
    step = StepInput({}, {}, 3, {}, None, None, (), returns={"c1": [1, 2]})
    assert wire.loads_state(wire.dumps_state(step)).returns == {"c1": [1, 2]}
