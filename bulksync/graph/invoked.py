"""Which compiled graph a node's function invokes, found by reading the function.

``get_state(subgraphs=True)`` shows the state of a graph a node invokes inside its function
(``sub.invoke(...)``), as LangGraph does; the node names no subgraph, so the graph is found
where the function can reach it: its closure cells and the globals its code names (nested
functions' code included), or a wrapper of one (its ``__wrapped__``). Only a function that
reaches exactly one compiled graph counts.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Any

from bulksync.coordinator.spec import GraphSpec


def invoked_graph(action: Any) -> Any:
    """The one compiled graph ``action`` can invoke, or None (none, several, or no code)."""
    func = getattr(action, "func", action)  # a wrapped callable keeps the user's function
    if inspect.ismethod(func):
        func = func.__func__
    if not isinstance(func, types.FunctionType):
        return None
    # A wrapper standing for a graph names it as ``__wrapped__`` (``functools.wraps``' rule).
    reached = (getattr(g, "__wrapped__", g) for g in _reachable(func))
    found = {id(g): g for g in reached if isinstance(getattr(g, "spec", None), GraphSpec)}
    return next(iter(found.values())) if len(found) == 1 else None


def _reachable(func: types.FunctionType) -> Iterator[Any]:
    for cell in func.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    names = set(_names(func.__code__))
    for name in names:
        if name in func.__globals__:
            yield func.__globals__[name]


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)
