"""``astream_events(version="v1" | "v2")``: LangChain's callback events of a run.

LangChain builds these events (``on_chain_start``, ``on_chat_model_stream``, …) from the
callbacks a run fires; a graph fires them for itself and for each task (``workers/tracing``),
and LangChain's own ``astream_events`` turns them into the event stream, calling the graph's
``astream`` with the caller's keywords. That is langchain-core's code, run on the graph as a
Runnable would be: the events are LangChain's own, filters (``include_names``, …) included.
langchain-core is the ``agents`` extra; without it there are no such events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any


def callback_events(
    graph: Any, input: Any, config: Mapping[str, Any] | None, *, version: str, **kwargs: Any
) -> AsyncIterator[Any]:
    """The events of a run of ``graph`` (anything with ``astream`` and ``get_name``).

    Raises:
        ImportError: langchain-core is not installed.
        NotImplementedError: a version other than ``"v1"``/``"v2"``.
    """
    try:
        from langchain_core.runnables import Runnable
    except ImportError as exc:
        raise ImportError(
            f"astream_events(version={version!r}) streams LangChain's callback events and "
            "needs langchain-core: pip install 'bulksync[agents]' (or use "
            "astream_events(version='v3'), which does not)."
        ) from exc

    class GraphRunnable(Runnable[Any, Any]):
        """The graph as LangChain's event streaming sees it: a Runnable whose ``astream``
        is the graph's (looked up on each call)."""

        def __init__(self) -> None:
            self.name = graph.get_name()

        def invoke(self, input: Any, config: Any = None, **kw: Any) -> Any:
            return graph.invoke(input, config, **kw)

        def astream(self, input: Any, config: Any = None, **kw: Any) -> AsyncIterator[Any]:
            return graph.astream(input, config, **kw)  # type: ignore[no-any-return]

    runnable: Any = GraphRunnable()  # the version is the caller's: checked by LangChain
    events: AsyncIterator[Any] = runnable.astream_events(
        input, dict(config) if config is not None else None, version=version, **kwargs
    )
    return events
