"""The ``tools`` stream mode: each LangChain tool call a node makes, as it starts and ends.

When a run streams ``tools``, each task runs with a LangChain callback handler in the config
its node (and every tool it calls, ``ToolNode``'s included) sees. A tool call streams
``{"event": "tool-started", "tool_call_id", "tool_name", "input"}``, then
``{"event": "tool-finished", "tool_call_id", "output"}`` or ``{"event": "tool-error",
"tool_call_id", "message"}``, under the namespace of the graph the tool runs in. A tool that
pauses on ``interrupt`` reports no error: it runs again, and reports again, on resume.
Nothing here imports langchain-core unless a run asks for ``tools``.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Callable
from typing import Any

from bulksync.errors import GraphInterrupt

Emit = Callable[[dict[str, Any]], None]
"""Passes one ``tools`` payload on to the run's stream."""


def tool_events(modes: Any, emit: Emit) -> Any:
    """The callback handler of one task's ``tools`` stream, when the run asks for that mode
    and langchain-core is installed; None otherwise."""
    if "tools" not in modes or importlib.util.find_spec("langchain_core") is None:
        return None
    return _handler_class()(emit)


_HANDLER: type[Any] | None = None


def _handler_class() -> type[Any]:
    global _HANDLER
    if _HANDLER is None:
        _HANDLER = _build_handler()
    return _HANDLER


def _build_handler() -> type[Any]:
    from langchain_core.callbacks import BaseCallbackHandler

    class ToolEvents(BaseCallbackHandler):
        """Streams the start and the end of each tool call, keyed by its call id."""

        run_inline = True  # on the tool's thread, in order

        def __init__(self, emit: Emit) -> None:
            self.emit = emit
            self.calls: dict[uuid.UUID, str] = {}

        def on_tool_start(
            self,
            serialized: dict[str, Any] | None,
            input_str: str,
            *,
            run_id: uuid.UUID,
            inputs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            call_id = str(kwargs.get("tool_call_id") or run_id)
            self.calls[run_id] = call_id
            name = (serialized or {}).get("name") or kwargs.get("name") or ""
            payload: dict[str, Any] = {
                "event": "tool-started",
                "tool_call_id": call_id,
                "tool_name": name,
            }
            if inputs is not None:
                payload["input"] = inputs
            self.emit(payload)

        def on_tool_end(self, output: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
            call_id = self.calls.pop(run_id, None)
            if call_id is not None:
                self.emit({"event": "tool-finished", "tool_call_id": call_id, "output": output})

        def on_tool_error(self, error: BaseException, *, run_id: uuid.UUID, **kwargs: Any) -> None:
            call_id = self.calls.pop(run_id, None)
            if call_id is not None and not isinstance(error, GraphInterrupt):
                self.emit({"event": "tool-error", "tool_call_id": call_id, "message": str(error)})

    return ToolEvents
