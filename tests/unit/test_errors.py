"""The error tree: drawn truly in errors.py's docstring, the only home of exception classes,
task errors' ``retryable`` flag, and which bad arguments raise ``ConfigError``."""

from __future__ import annotations

import ast
import builtins
import copy
import operator
import pickle
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

import pytest

import bulksync
from bulksync import errors
from bulksync.errors import (
    BulkSyncError,
    ConfigError,
    StoredError,
    TaskCancelledError,
    TaskError,
    TaskTimeoutError,
    UnknownGraphError,
    UsageError,
)

PACKAGE = Path(bulksync.__file__).parent

PRIVATE_EXCEPTIONS = {
    ("checkpoint/serde.py", "_Unencodable"),
    ("prebuilt/tool_node.py", "_InvalidArguments"),
}
"""Exception classes allowed outside errors.py, each private to its module and never escaping it.

``_Unencodable`` aborts msgpack's ``default`` hook and ``MsgpackSerde.dumps`` turns it into a
``SerializationError`` at once; ``_InvalidArguments`` carries a tool call's rejected arguments
from the tool to ``ToolNode``'s error handling in the same method, which turns it into the
ToolMessage the model reads. In errors.py either would be a public name users could catch,
or a private name imported across packages.
"""

_TREE_LINE = re.compile(
    r"^(?P<lead>[│├└─ ]*)(?P<name>[A-Z]\w+)(?:\s+\((?:also )?(?P<bases>[\w, ]+)\))?"
)


def drawn_tree() -> dict[str, tuple[str | None, frozenset[str]]]:
    """``{class: (parent or None, stdlib bases)}`` as errors.py's docstring draws them."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].split("\n\n")[1]  # the indented block after "::"
    drawn: dict[str, tuple[str | None, frozenset[str]]] = {}
    stack: list[str] = []
    for line in block.splitlines():
        match = _TREE_LINE.match(line.strip("\n")[4:])  # the block is indented by four
        assert match, f"cannot read tree line {line!r}"
        depth = len(match["lead"]) // 4
        del stack[depth:]
        parent = stack[-1] if stack else None
        bases = frozenset(b.strip() for b in (match["bases"] or "").split(",") if b.strip())
        assert match["name"] not in drawn, f"{match['name']} is drawn twice"
        drawn[match["name"]] = (parent, bases)
        stack.append(match["name"])
    return drawn


def real_tree() -> dict[str, tuple[str | None, frozenset[str]]]:
    """The same shape, read from the classes: each one's bulksync parent and stdlib bases."""
    real: dict[str, tuple[str | None, frozenset[str]]] = {}
    todo: list[type[BaseException]] = [BulkSyncError]
    while todo:
        cls = todo.pop()
        ours = [b for b in cls.__bases__ if issubclass(b, BulkSyncError)]
        assert len(ours) <= 1, f"{cls.__name__} has two parents in the tree: {ours}"
        stdlib = frozenset(b.__name__ for b in cls.__bases__ if b not in ours)
        real[cls.__name__] = (ours[0].__name__ if ours else None, stdlib)
        todo.extend(cls.__subclasses__())
    return real


def test_the_docstring_draws_every_class_at_its_place_with_its_stdlib_bases() -> None:
    drawn, real = drawn_tree(), real_tree()
    assert set(drawn) == set(real), "drawn but not defined, or defined but not drawn"
    for name, (parent, bases) in real.items():
        assert drawn[name] == (parent, bases), f"{name}: drawn {drawn[name]}, is {(parent, bases)}"


def test_every_tree_class_is_defined_in_errors_py() -> None:
    for name in real_tree():
        assert getattr(errors, name).__module__ == "bulksync.errors", name


def _is_exception(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def exception_classes(path: Path) -> Iterator[str]:
    """Names of the classes ``path`` defines that derive from an exception (read with ast)."""
    known = {n for n, v in [*vars(builtins).items(), *vars(errors).items()] if _is_exception(v)}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        names = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
        if names & known or any(n.endswith(("Error", "Exception")) for n in names):
            known.add(node.name)  # a later class of the same module may derive from it
            yield node.name


WARNINGS = PACKAGE / "warnings.py"
"""The one home of warning classes (LangGraph's names, ``langgraph.warnings``'s module path)."""


def test_no_exception_class_is_defined_outside_errors_py() -> None:
    outside = {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in PACKAGE.rglob("*.py")
        if path not in (PACKAGE / "errors.py", WARNINGS)
        for name in exception_classes(path)
    }
    assert outside == PRIVATE_EXCEPTIONS


def test_warnings_py_defines_warnings_only() -> None:
    from bulksync import warnings as bs_warnings

    defined = set(exception_classes(WARNINGS))
    assert defined and all(issubclass(getattr(bs_warnings, n), Warning) for n in defined)


def test_the_walk_finds_exception_classes() -> None:
    assert set(exception_classes(PACKAGE / "errors.py")) >= set(real_tree())


@pytest.mark.parametrize("name", sorted(real_tree()))
def test_each_class_says_when_it_is_raised_in_one_line(name: str) -> None:
    doc = getattr(errors, name).__doc__ or ""
    assert doc.startswith("Raised "), f"{name}: {doc!r}"
    assert "\n" not in doc.split("\n\n")[0], f"{name}: the first paragraph is one line"


# -- task errors and their retryable flag -----------------------------------------------


@pytest.mark.parametrize(
    ("cls", "retryable"),
    [
        (TaskError, False),
        (TaskCancelledError, False),
        (TaskTimeoutError, True),
        (UnknownGraphError, False),
    ],
)
def test_task_errors_have_a_class_default_an_instance_may_override(
    cls: type[TaskError], retryable: bool
) -> None:
    assert cls("x").retryable is retryable
    assert cls("x", retryable=not retryable).retryable is (not retryable)
    assert cls("x", retryable=not retryable).args == ("x",)  # the flag is not an argument
    assert cls.retryable is retryable  # an override leaves the class alone


def test_task_errors_keep_the_stdlib_bases_users_catch() -> None:
    with pytest.raises(TimeoutError):
        raise TaskTimeoutError("slow", retryable=False)
    with pytest.raises(LookupError):
        raise UnknownGraphError("no graph 'g'")


def test_stored_error_keeps_its_flag_through_copy_and_pickle() -> None:
    stored = StoredError("far.Boom", "boom", "Boom('boom')", retryable=True)
    for twin in (copy.deepcopy(stored), pickle.loads(pickle.dumps(stored))):
        assert twin == stored and repr(twin) == "Boom('boom')"
        assert twin.retryable is True
    assert StoredError("far.Boom", "boom").retryable is False


# -- ConfigError: bad settings and arguments, still caught as ValueError -----------------


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(tag: str = "a", *, saved: bool = False) -> Any:
    from bulksync.checkpoint.memory import InMemorySaver
    from bulksync.graph import END, START, StateGraph

    builder = StateGraph(_State)
    builder.add_node(tag, lambda s: {"log": [tag]})
    builder.add_edge(START, tag)
    builder.add_edge(tag, END)
    return builder.compile(checkpointer=InMemorySaver() if saved else None)


def _stream_mode() -> Any:
    return list(_graph().stream({"log": []}, stream_mode="bogus"))


def _max_concurrency() -> Any:
    return _graph().invoke({"log": []}, {"max_concurrency": 0})


def _drawing() -> Any:
    """bulksync's own drawing, which get_graph() returns when langchain-core is absent."""
    from bulksync.graph.layout import builder_drawable

    return builder_drawable(_graph().builder)


def _curve_style() -> Any:
    return _drawing().draw_mermaid(curve_style="zigzag")


def _wrap_words() -> Any:
    return _drawing().draw_mermaid(wrap_label_n_words=0)


def _demo_topics() -> Any:
    from bulksync.demo import make_subjects

    return make_subjects([], 3)


def _demo_fanout() -> Any:
    from bulksync.demo import make_subjects

    return make_subjects(["cats"], 0)


def _runs() -> Any:
    from bulksync.service.runs import RunStore

    return RunStore(cast(Any, None))  # each check fails before the pool is used


def _run_kind() -> Any:
    return _runs().create(graph_id="g", thread_id="t", kind="bogus", payload={})


def _run_strategy() -> Any:
    return _runs().create(
        graph_id="g", thread_id="t", kind="invoke", payload={}, multitask_strategy="bogus"
    )


def _run_final_status() -> Any:
    return _runs().finish("run", "owner", "running")


def _run_status_filter() -> Any:
    return _runs().list(status="bogus")


def _lease_ttl() -> Any:
    from bulksync.checkpoint.postgres import PostgresSaver

    return PostgresSaver(cast(Any, None)).acquire_lease("thread", "owner", ttl=0)


def _put_writes_without_checkpoint() -> Any:
    from bulksync.checkpoint.memory import InMemorySaver

    return InMemorySaver().put_writes({"configurable": {"thread_id": "t"}}, [], "task")


def _registry_ref(ref: str) -> Callable[[], Any]:
    def load() -> Any:
        from bulksync.workers.registry import GraphRegistry

        return GraphRegistry().load(ref)

    return load


def _registry_duplicate() -> Any:
    from bulksync.workers.registry import GraphRegistry

    registry = GraphRegistry()
    registry.add("m:g", _graph("a"))
    registry.add("m:g", _graph("b"))


CONFIG_ERRORS: dict[str, tuple[Callable[[], Any], str]] = {
    "stream mode": (_stream_mode, "Unknown stream_mode 'bogus'"),
    "max_concurrency": (_max_concurrency, "max_concurrency must be an integer >= 1"),
    "draw_mermaid curve_style": (_curve_style, "unknown curve_style 'zigzag'"),
    "draw_mermaid wrap_label_n_words": (_wrap_words, "pass 1 or more"),
    "demo topics": (_demo_topics, "pass a non-empty 'topics' list"),
    "demo fanout": (_demo_fanout, "pass a fanout of 1 or more"),
    "run kind": (_run_kind, "unknown run kind 'bogus'"),
    "run multitask_strategy": (_run_strategy, "use 'enqueue'"),
    "run final status": (_run_final_status, "is not a final status"),
    "run status filter": (_run_status_filter, "unknown run status 'bogus'"),
    "lease ttl": (_lease_ttl, "lease ttl must be a positive number"),
    "put_writes config": (_put_writes_without_checkpoint, "pass the config returned by put"),
    "--graph malformed": (_registry_ref("not a ref"), "expected 'pkg.module'"),
    "--graph not importable": (_registry_ref("bulksync_no_such_module"), "cannot import"),
    "--graph no attribute": (_registry_ref("bulksync.demo:nope"), "has no 'nope'; check"),
    "--graph no graph": (_registry_ref("bulksync.errors"), "defines no compiled graph"),
    "graph id taken": (_registry_duplicate, "already registered to another graph; give"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_ERRORS))
def test_bad_settings_and_arguments_raise_config_error(case: str) -> None:
    trigger, message = CONFIG_ERRORS[case]
    with pytest.raises(ConfigError, match=re.escape(message)):
        trigger()
    with pytest.raises(ValueError):  # what callers caught before, and LangGraph users catch
        trigger()


def test_usage_error_is_a_config_error_and_a_value_error() -> None:
    assert issubclass(UsageError, ConfigError) and issubclass(UsageError, ValueError)


def _recursion_limit() -> Any:
    return _graph().invoke({"log": []}, {"recursion_limit": 0})


def _no_thread() -> Any:
    return _graph(saved=True).invoke({"log": []})


def _no_checkpointer() -> Any:
    return _graph().get_state({"configurable": {"thread_id": "t"}})


def _unknown_subgraph_ns() -> Any:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "nope:1"}}
    return _graph(saved=True).update_state(config, {})  # (a read uses the graph's channels)


def _add_messages_one_side() -> Any:
    from bulksync.graph import add_messages

    return add_messages([], None)


def _add_messages_format() -> Any:
    from bulksync.graph import add_messages

    return add_messages(format=cast(Any, "bogus"))


LANGGRAPH_VALUE_ERRORS: dict[str, Callable[[], Any]] = {
    "recursion_limit=0": _recursion_limit,
    "checkpointed run without thread_id": _no_thread,
    "get_state without checkpointer": _no_checkpointer,
    "update at an unknown checkpoint_ns": _unknown_subgraph_ns,
    "add_messages with one side": _add_messages_one_side,
    "add_messages format": _add_messages_format,
}
"""Where LangGraph raises a bare ValueError for the same call, and so does bulksync: the
conformance suite compares error class names with LangGraph's."""


@pytest.mark.parametrize("case", sorted(LANGGRAPH_VALUE_ERRORS))
def test_langgraph_twins_stay_a_bare_value_error(case: str) -> None:
    with pytest.raises(ValueError) as info:
        LANGGRAPH_VALUE_ERRORS[case]()
    assert type(info.value) is ValueError
