"""The implementations a conformance scenario can run on, each behind one `Impl` namespace.

LangGraph is the reference. bulksync mirrors LangGraph module for module, so both are loaded
the same way; bulksync is imported only when its `Impl` is built, so a missing bulksync name
fails the bulksync side of a test and nothing else. A "flavour" is a named way to run bulksync:
`bulksync` runs graphs in-process; `celery` compiles them the same way and then attaches them
to a Celery executor whose tasks the test session's in-process worker runs (the `cluster`
fixture); `remote` registers them with a coordinator service of the test's own and runs them
through `bulksync.client.RemoteGraph` (see `remote.py`). A new flavour is a new entry in
`LOADERS` whose `Impl.compiler` swaps how graphs are compiled or executed; a flavour that needs
a fixture names it in `FIXTURES`, and the conftest hands the fixture's value to `bind` before
the flavour is loaded. Scenarios a flavour cannot run like LangGraph are in `EXCLUDED` (inherent
differences) or `KNOWN_BUGS` (bulksync bugs), each with its reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

REFERENCE = "langgraph"
"""The implementation whose observations are the expected values."""

DEFAULT_FLAVOURS = ("bulksync", "celery", "remote")
"""The implementations compared against the reference when nothing else is asked for."""

FLAVOURS_ENV = "CONFORMANCE_FLAVOURS"
"""Comma-separated flavour names overriding `DEFAULT_FLAVOURS` (e.g. `langgraph` to self-check)."""


@dataclass(frozen=True)
class Impl:
    """Everything a scenario needs from one implementation, named as in LangGraph."""

    name: str
    StateGraph: Any
    START: str
    END: str
    MessagesState: Any
    add_messages: Any
    Send: Any
    Command: Any
    interrupt: Callable[..., Any]
    Interrupt: Any
    RetryPolicy: Any
    TimeoutPolicy: Any
    CachePolicy: Any
    Overwrite: Any
    errors: ModuleType
    get_stream_writer: Callable[[], Callable[[Any], None]]
    InMemorySaver: Any
    prebuilt: ModuleType
    runtime: ModuleType
    managed: ModuleType
    func: ModuleType
    store: ModuleType
    cache: ModuleType
    get_store: Callable[[], Any]
    stream: ModuleType
    callbacks: ModuleType
    compiler: Callable[..., Any] | None = None
    saver_factory: Callable[[], Any] | None = None
    attach: Callable[[Any], Any] | None = None

    def compile(self, builder: Any, **kw: Any) -> Any:
        """Compile `builder` the way this flavour runs graphs (default: `builder.compile`)."""
        if self.compiler is not None:
            return self.compiler(builder, **kw)
        return builder.compile(**kw)

    def entrypoint(self, **kw: Any) -> Callable[[Callable[..., Any]], Any]:
        """``@entrypoint(**kw)``, the graph it makes run the way this flavour runs graphs."""

        def decorate(func: Callable[..., Any]) -> Any:
            graph = self.func.entrypoint(**kw)(func)
            return self.attach(graph) if self.attach is not None else graph

        return decorate

    def saver(self) -> Any:
        """A fresh in-memory checkpointer (or the checkpointer this flavour always uses)."""
        if self.saver_factory is not None:
            return self.saver_factory()
        return self.InMemorySaver()


def _load(pkg: str, name: str) -> Impl:
    """Build the `Impl` of package `pkg`, whose modules mirror LangGraph's."""
    graph = importlib.import_module(f"{pkg}.graph")
    types = importlib.import_module(f"{pkg}.types")
    config = importlib.import_module(f"{pkg}.config")
    memory = importlib.import_module(f"{pkg}.checkpoint.memory")
    return Impl(
        name=name,
        StateGraph=graph.StateGraph,
        START=graph.START,
        END=graph.END,
        MessagesState=graph.MessagesState,
        add_messages=graph.add_messages,
        Send=types.Send,
        Command=types.Command,
        interrupt=types.interrupt,
        Interrupt=types.Interrupt,
        RetryPolicy=types.RetryPolicy,
        TimeoutPolicy=types.TimeoutPolicy,
        CachePolicy=types.CachePolicy,
        Overwrite=types.Overwrite,
        errors=importlib.import_module(f"{pkg}.errors"),
        get_stream_writer=config.get_stream_writer,
        InMemorySaver=memory.InMemorySaver,
        prebuilt=importlib.import_module(f"{pkg}.prebuilt"),
        runtime=importlib.import_module(f"{pkg}.runtime"),
        managed=importlib.import_module(f"{pkg}.managed"),
        func=importlib.import_module(f"{pkg}.func"),
        store=importlib.import_module(f"{pkg}.store.memory"),
        cache=importlib.import_module(f"{pkg}.cache.memory"),
        get_store=config.get_store,
        stream=importlib.import_module(f"{pkg}.stream"),
        callbacks=importlib.import_module(f"{pkg}.callbacks"),
    )


FIXTURES: dict[str, str] = {"celery": "cluster", "remote": "remote_service"}
"""The fixture a flavour needs, by flavour name (its value goes to `bind`)."""

_CONTROL_IS_LOCAL = (
    "a RunControl lives in the caller's process and RemoteGraph runs on the coordinator's; "
    "a detached run is stopped through its run (Client.cancel)"
)

_NODES_RUN_ON_WORKERS = (
    "on a cluster a run's nodes run on worker processes, never on the caller's event loop, so "
    "they share no asyncio objects with the caller"
)

EXCLUDED: dict[str, dict[str, str]] = {
    "celery": {"nodes_share_the_callers_loop": _NODES_RUN_ON_WORKERS},
    "remote": {
        "nodes_share_the_callers_loop": _NODES_RUN_ON_WORKERS,
        "clearing_the_node_cache": (
            "clear_cache is a method of the compiled graph, whose cache lives with the "
            "service that runs it; a RemoteGraph has no such method"
        ),
        "step_timeout": (
            "it sets step_timeout on the graph between runs, and a RemoteGraph runs the graph "
            "as its service loaded it (the attribute is set in the graph's module there)"
        ),
        "command_errors": (
            "its `resume_without_saver` case needs a graph without a checkpointer, and a "
            "RemoteGraph run always checkpoints to Postgres, so LangGraph's RuntimeError "
            "cannot happen"
        ),
        "debug_stream_without_checkpointer": (
            "it streams a graph without a checkpointer, and a RemoteGraph run always "
            "checkpoints to Postgres, so its checkpoint chunks are there by design"
        ),
        "drain_and_resume": _CONTROL_IS_LOCAL,
        "drain_in_the_last_step_or_before_a_breakpoint": _CONTROL_IS_LOCAL,
        "empty_input": (
            "its `no_thread_id` case calls a checkpointed graph without a thread id, and "
            "a RemoteGraph call without one runs on a new thread (the client makes one up), "
            "so LangGraph's ValueError cannot happen"
        ),
    },
}
"""Scenarios a flavour cannot observe as LangGraph does, by flavour, each with its reason.

Only differences inherent to the way the flavour runs graphs belong here; the conftest skips
these scenarios on that flavour, naming the reason. A bulksync bug goes to `KNOWN_BUGS`.
"""

KNOWN_BUGS: dict[str, dict[str, str]] = {"celery": {}, "remote": {}}
"""Scenarios a flavour fails because of a bulksync bug, by flavour, each naming the bug.

The conftest reports them as expected failures on that flavour, and fails them once they
pass (naming this table), so an entry goes away with the fix of its bug.
"""

_BOUND: dict[str, Any] = {}


def bind(flavour: str, value: Any) -> None:
    """Give `flavour` the value of its fixture (see `FIXTURES`) before it is loaded."""
    if _BOUND.get(flavour) is not value:
        _BOUND[flavour] = value
        _CACHE.pop(flavour, None)


def _load_celery() -> Impl:
    """bulksync, each compiled graph attached to the session's Celery cluster."""
    cluster = _BOUND.get("celery")
    if cluster is None:
        raise RuntimeError(
            "the celery flavour needs the `cluster` fixture; run it through the conformance "
            "conftest (which binds it), not by calling load_impl('celery') directly"
        )

    def compiler(builder: Any, **kw: Any) -> Any:
        return cluster.attach(builder.compile(**kw))

    return dataclasses.replace(
        _load("bulksync", "celery"), compiler=compiler, attach=cluster.attach
    )


def _load_remote() -> Impl:
    """bulksync, each compiled graph run through `RemoteGraph` on the test's coordinator."""
    service = _BOUND.get("remote")
    if service is None:
        raise RuntimeError(
            "the remote flavour needs the `remote_service` fixture; run it through the "
            "conformance conftest (which binds it), not by calling load_impl('remote') directly"
        )
    from . import remote

    return dataclasses.replace(
        _load("bulksync", "remote"),
        StateGraph=remote.StateGraph,
        compiler=service.compile,
        saver_factory=lambda: service.saver,
        attach=service.handle,
    )


LOADERS: dict[str, Callable[[], Impl]] = {
    "langgraph": lambda: _load("langgraph", "langgraph"),
    "bulksync": lambda: _load("bulksync", "bulksync"),
    "celery": _load_celery,
    "remote": _load_remote,
}
"""How to build each implementation, by flavour name; called lazily, on first use and again
whenever `bind` gives the flavour a new fixture value (`remote`: every test)."""


def flavours() -> list[str]:
    """The flavour names to compare against the reference in this session."""
    raw = os.environ.get(FLAVOURS_ENV, "")
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(DEFAULT_FLAVOURS)
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        raise ValueError(f"{FLAVOURS_ENV} names unknown flavours {unknown}; known: {list(LOADERS)}")
    return names


_CACHE: dict[str, Impl] = {}


def load_impl(name: str) -> Impl:
    """The `Impl` for flavour `name`, built on first use."""
    if name not in _CACHE:
        _CACHE[name] = LOADERS[name]()
    return _CACHE[name]
