"""The graph registry: what ``--graph`` loads, what it refuses, and the task name of each node."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulksync.errors import UnknownGraphError
from bulksync.graph import START, StateGraph
from bulksync.settings import Settings
from bulksync.workers.celery import node_task
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.node_task import WorkerRuntime, install
from bulksync.workers.registry import GraphRegistry, is_compiled_graph, spec_at, task_name

MODULE = '''
"""Two compiled graphs (one with a subgraph node, itself nesting one) and things that are not."""

import operator
from typing import Annotated, TypedDict

from bulksync.graph import START, StateGraph


class State(TypedDict):
    log: Annotated[list[str], operator.add]


leaf = StateGraph(State)
leaf.add_node("deep", lambda s: {"log": ["deep"]})
leaf.add_edge(START, "deep")

middle = StateGraph(State)
middle.add_node("inner", lambda s: {"log": ["inner"]})
middle.add_node("nested", leaf.compile())
middle.add_edge(START, "inner")
middle.add_edge("inner", "nested")

builder = StateGraph(State)
builder.add_node("outer", lambda s: {"log": ["outer"]})
builder.add_node("sub", middle.compile())
builder.add_edge(START, "outer")
builder.add_edge("outer", "sub")
graph = builder.compile()

other = StateGraph(State)
other.add_node("only", lambda s: {"log": ["only"]})
other.add_edge(START, "only")
second = other.compile()

number = 3
'''

EMPTY = '''
"""A module without compiled graphs."""

from bulksync.graph import StateGraph

not_compiled = StateGraph(dict)
'''


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """Names of two fresh importable modules: one with graphs, one without."""
    tag = uuid.uuid4().hex[:10]
    names = (f"bulksync_reg_graphs_{tag}", f"bulksync_reg_empty_{tag}")
    for name, source in zip(names, (MODULE, EMPTY), strict=True):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield names
    for name in names:
        sys.modules.pop(name, None)


def test_load_one_attribute(modules: tuple[str, str]) -> None:
    name, _ = modules
    registry = GraphRegistry()
    assert registry.load(f"{name}:graph") == [f"{name}:graph"]
    assert registry.ids() == [f"{name}:graph"]
    assert registry.get(f"{name}:graph") is sys.modules[name].graph
    assert f"{name}:graph" in registry and f"{name}:second" not in registry


def test_load_a_module_takes_every_compiled_graph_at_top_level(modules: tuple[str, str]) -> None:
    name, _ = modules
    registry = GraphRegistry()
    assert registry.load(name) == [f"{name}:graph", f"{name}:second"]
    assert registry.ids() == [f"{name}:graph", f"{name}:second"]


def test_loading_twice_is_harmless(modules: tuple[str, str]) -> None:
    name, _ = modules
    registry = GraphRegistry()
    registry.load(name)
    registry.load(f"{name}:graph")
    assert registry.ids() == [f"{name}:graph", f"{name}:second"]


@pytest.mark.parametrize(
    "ref",
    ["", "pkg module", "pkg..module", ".pkg", "pkg.module:", "pkg:attr:more", "pkg:1attr", "a-b"],
)
def test_malformed_reference_is_refused_with_the_expected_form(ref: str) -> None:
    with pytest.raises(ValueError, match=r"expected 'pkg\.module' or 'pkg\.module:attr'") as info:
        GraphRegistry().load(ref)
    assert repr(ref) in str(info.value)


def test_unimportable_module_is_named() -> None:
    missing = f"bulksync_no_such_module_{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match=f"cannot import module '{missing}'.*PYTHONPATH"):
        GraphRegistry().load(f"{missing}:graph")


def test_missing_attribute_is_named(modules: tuple[str, str]) -> None:
    name, _ = modules
    with pytest.raises(ValueError, match=f"module '{name}' has no 'nope'"):
        GraphRegistry().load(f"{name}:nope")


def test_attribute_that_is_not_a_compiled_graph_is_refused(modules: tuple[str, str]) -> None:
    name, _ = modules
    with pytest.raises(TypeError, match=r"is a StateGraph, not a compiled graph.*compile\(\)"):
        GraphRegistry().load(f"{name}:builder")
    with pytest.raises(TypeError, match="is a int, not a compiled graph"):
        GraphRegistry().load(f"{name}:number")


def test_module_without_graphs_is_refused(modules: tuple[str, str]) -> None:
    _, empty = modules
    with pytest.raises(ValueError, match=f"'{empty}' defines no compiled graph.*pkg.module:attr"):
        GraphRegistry().load(empty)


def test_one_id_cannot_name_two_graphs(modules: tuple[str, str]) -> None:
    name, _ = modules
    registry = GraphRegistry()
    registry.load(f"{name}:graph")
    with pytest.raises(ValueError, match=f"'{name}:graph' is already registered"):
        registry.add(f"{name}:graph", sys.modules[name].second)


def test_unknown_id_names_what_was_loaded_and_the_option() -> None:
    registry = GraphRegistry()
    with pytest.raises(UnknownGraphError, match="loaded: none"):
        registry.get("pkg.mod:graph")
    registry.add("a.b:g", _tiny())
    with pytest.raises(UnknownGraphError) as info:
        registry.get("pkg.mod:graph")
    message = str(info.value)
    assert "graph 'pkg.mod:graph' is not loaded" in message
    assert "loaded: a.b:g" in message
    assert "--graph pkg.mod:graph" in message
    assert isinstance(info.value, LookupError)


def test_task_names_cover_every_node_of_every_nesting_level(modules: tuple[str, str]) -> None:
    name, _ = modules
    registry = GraphRegistry()
    registry.load(name)
    gid, sid = f"{name}:graph", f"{name}:second"
    assert sorted(registry.task_names()) == sorted(
        [
            f"{gid}.__start__",
            f"{gid}.outer",
            f"{gid}.sub",
            f"{gid}.sub.__start__",
            f"{gid}.sub.inner",
            f"{gid}.sub.nested",
            f"{gid}.sub.nested.__start__",
            f"{gid}.sub.nested.deep",
            f"{sid}.__start__",
            f"{sid}.only",
        ]
    )
    assert task_name(gid, ("sub", "nested"), "deep") == f"{gid}.sub.nested.deep"
    assert task_name(gid, (), "outer") == f"{gid}.outer"


def test_spec_at_follows_subgraph_nodes(modules: tuple[str, str]) -> None:
    name, _ = modules
    registry = GraphRegistry()
    registry.load(f"{name}:graph")
    assert set(registry.spec(f"{name}:graph", ("sub", "nested")).nodes) >= {"deep"}
    assert set(registry.spec(f"{name}:graph").nodes) >= {"outer", "sub"}


@pytest.mark.parametrize("path", [("outer",), ("nope",), ("sub", "inner")])
def test_spec_at_refuses_a_path_through_a_non_subgraph(
    modules: tuple[str, str], path: tuple[str, ...]
) -> None:
    name, _ = modules
    registry = GraphRegistry()
    registry.load(f"{name}:graph")
    with pytest.raises(UnknownGraphError, match=f"'{path[-1]}' is not a subgraph node"):
        spec_at(registry.get(f"{name}:graph"), path)


def test_install_registers_one_celery_task_per_node(
    modules: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _ = modules
    registry = GraphRegistry()
    registry.load(name)
    app = make_app(Settings())  # no broker connection is made
    # install() makes its runtime this process's; put back the one a cluster fixture installed.
    monkeypatch.setattr(node_task, "_runtime", node_task.current_runtime())
    names = install(app, WorkerRuntime(registry, Settings()))
    assert sorted(names) == sorted(registry.task_names())
    assert set(names) <= set(app.tasks)


def test_is_compiled_graph() -> None:
    assert is_compiled_graph(_tiny())
    assert not is_compiled_graph(StateGraph(dict))
    assert not is_compiled_graph(object())


def _tiny() -> object:
    b = StateGraph(dict)
    b.add_node("n", lambda s: {})
    b.add_edge(START, "n")
    return b.compile()
