"""The demo's map-reduce graph: subjects, fan-out by Send, the reduce step."""

from __future__ import annotations

from typing import Any

import pytest

from bulksync.demo import (
    DEFAULT_TOPICS,
    JokeTask,
    build_demo_graph,
    demo_input,
    generate,
    make_subjects,
    summarize,
)


def test_subjects_take_topics_in_order() -> None:
    assert make_subjects(["a", "b", "c"], 2) == ["a", "b"]


def test_subjects_wrap_with_numbers_and_stay_unique() -> None:
    subjects = make_subjects(["a", "b"], 5)
    assert subjects[:2] == ["a", "b"]
    assert subjects[2:] == ["a #2", "b #2", "a #3"]
    assert len(set(subjects)) == 5


@pytest.mark.parametrize(("topics", "fanout"), [([], 3), (["a"], 0), (["a"], -1)])
def test_subjects_reject_bad_input(topics: list[str], fanout: int) -> None:
    with pytest.raises(ValueError, match=r"topic|fanout"):
        make_subjects(topics, fanout)


def test_generate_is_deterministic_and_names_its_subject() -> None:
    first = generate(JokeTask(subject="owls"))
    assert first == generate(JokeTask(subject="owls"))
    (joke,) = first["jokes"]
    assert "owls" in joke


def test_summarize_picks_the_longest_joke_first_on_ties() -> None:
    out = summarize({"jokes": ["bb", "a", "cc"]})
    assert out["best_joke"] == "bb"
    assert out["summary"].startswith("3 jokes")


def test_summarize_without_jokes() -> None:
    assert summarize({})["best_joke"] == ""


@pytest.mark.parametrize("fanout", [1, 4, len(DEFAULT_TOPICS) + 3])
def test_graph_fans_out_one_generate_task_per_subject(fanout: int) -> None:
    graph = build_demo_graph().compile()
    updates = list(graph.stream(demo_input(fanout), stream_mode="updates"))
    nodes = [name for chunk in updates for name in chunk]
    assert nodes.count("split") == 1
    assert nodes.count("generate") == fanout
    assert nodes.count("summarize") == 1

    result: dict[str, Any] = graph.invoke(demo_input(fanout))
    subjects = make_subjects(DEFAULT_TOPICS, fanout)
    assert result["subjects"] == subjects
    # The reducer applies the Send tasks' writes in Send order, whatever order they finish in.
    assert result["jokes"] == [generate(JokeTask(subject=s))["jokes"][0] for s in subjects]
    assert result["best_joke"] == summarize({"jokes": result["jokes"]})["best_joke"]
