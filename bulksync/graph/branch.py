"""Conditional edges: a path function's answer mapped to the nodes that run next.

``add_conditional_edges(source, path, path_map)`` stores a ``Branch``. After ``source`` runs,
its writer calls ``path`` on the state (with the node's own writes applied) and turns each
answer into a trigger of the named node or a ``Send``. Answers go through ``path_map`` when
there is one; without one, a ``-> Literal["a", "b"]`` return annotation stands in for it, as
in LangGraph. Where LangGraph would drop a write to a node that does not exist, bulksync raises.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bulksync.constants import END, START
from bulksync.errors import InvalidGraphError, InvalidUpdateError, node_error_message
from bulksync.graph.schema import (
    InjectingCall,
    declared_input_schema,
    declared_return,
    injecting_call,
    literal_values,
)
from bulksync.types import Send

log = logging.getLogger(__name__)

Destination = str | Send
"""Where a branch sends the run: a node name (or END) or a ``Send`` packet."""


@dataclasses.dataclass(frozen=True, slots=True)
class Branch:
    """A conditional edge: ``path`` picks, ``ends`` (the path map) translates its answers.

    ``ends`` is None when any node may be named; ``input_schema`` is the schema the path's
    first parameter declares, which then decides what state it reads.
    """

    name: str
    path: Callable[..., Any]
    ends: Mapping[Hashable, str] | None = None
    input_schema: type[Any] | None = None
    call: InjectingCall = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "call", injecting_call(self.path))

    @classmethod
    def from_path(
        cls, path: Callable[..., Any], path_map: Mapping[Hashable, str] | Sequence[str] | None
    ) -> Branch:
        """A branch for ``path``, its map given as a dict, a list of names, or inferred."""
        ends: dict[Hashable, str] | None
        if isinstance(path_map, Mapping):
            ends = dict(path_map)
        elif path_map is not None and not isinstance(path_map, str):
            ends = {name: name for name in path_map}
        else:
            literals = literal_values(declared_return(path)) if _is_plain_function(path) else None
            ends = {value: value for value in literals} if literals else None
        return cls(branch_name(path), path, ends, declared_input_schema(path))

    def route(
        self, source: str, value: Any, nodes: Collection[str], *, strict: bool
    ) -> list[Destination]:
        """Call the path on ``value``; the nodes and Sends it picks (END dropped; an unknown
        node skipped with a warning unless ``strict``).

        Raises:
            InvalidGraphError: (``strict``) an answer names no node.
            KeyError: an answer is missing from the path map (LangGraph's error there).
            InvalidUpdateError: a ``Send`` is addressed to END.
        """
        result = run_to_completion(self.call(value))
        answers = list(result) if isinstance(result, (list, tuple)) else [result]
        picked: list[Destination] = []
        for answer in answers:
            dest = answer if isinstance(answer, Send) else self._lookup(source, answer)
            via = f"conditional edge '{self.name}'"
            if check_destination(source, dest, nodes, via=via, strict=strict) and dest != END:
                picked.append(dest)
        return picked

    def _lookup(self, source: str, answer: Any) -> Any:
        if self.ends is None:
            return answer
        try:
            return self.ends[answer]
        except (KeyError, TypeError):
            # A KeyError, as LangGraph raises here, with a message that says what to fix.
            raise KeyError(
                node_error_message(
                    source,
                    f"conditional edge '{self.name}' returned {answer!r}, which is not a key of "
                    f"its path_map {list(self.ends)}; return one of those keys or add it to the "
                    "path_map.",
                )
            ) from None


def check_destination(
    source: str, dest: Any, nodes: Collection[str], *, via: str, strict: bool
) -> bool:
    """Whether ``dest`` (a name or a ``Send``) is routed to from ``source``.

    A node the graph lacks is skipped with a warning, as LangGraph does; ``strict`` raises.

    Raises:
        InvalidGraphError: ``dest`` is None, START, not a str/Send, or (``strict``) names no
            node.
        InvalidUpdateError: ``dest`` is a ``Send`` to END.
    """
    if isinstance(dest, Send):
        if dest.node == END:
            raise InvalidUpdateError(
                node_error_message(source, f"{via}: Cannot send a packet to the END node.")
            )
        target = dest.node
    elif isinstance(dest, str) and dest != START:
        if dest == END:
            return True
        target = dest
    else:
        raise InvalidGraphError(
            node_error_message(
                source,
                f"{via} did not return a valid destination: got {dest!r}; return a node name, "
                "END, a Send, or a list of those.",
            )
        )
    if target in nodes:
        return True
    message = node_error_message(
        source,
        f"{via} routes to unknown node '{target}'. Known nodes: {sorted(nodes)}; add the node "
        "with add_node or fix the name.",
    )
    if strict:
        raise InvalidGraphError(message)
    warn_once(f"{message} Skipped (compile with strict=True to raise).")
    return False


@functools.lru_cache(maxsize=1024)
def warn_once(message: str) -> None:
    """Log ``message`` as a warning, once per process: a graph that routes or writes past
    its schema on every step says so once, not on every step."""
    log.warning("%s", message)


def branch_name(path: Any) -> str:
    """A branch's name: its function's name, or ``condition`` for lambdas and objects."""
    name = getattr(path, "__name__", None) if _is_plain_function(path) else None
    return name if isinstance(name, str) and name != "<lambda>" else "condition"


def _is_plain_function(path: Any) -> bool:
    return inspect.isfunction(path) or inspect.ismethod(path)


def run_to_completion(result: Any) -> Any:
    """``result``, or the value it resolves to when an async path returned an awaitable.

    Outside an event loop the awaitable runs on a fresh loop; inside one (an async node's
    writer) it runs on a helper thread with a copy of the context, since a running loop
    cannot be re-entered.
    """
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(result))
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, _awaited(result)).result()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
