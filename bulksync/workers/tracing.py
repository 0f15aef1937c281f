"""LangChain callbacks of a run and of its tasks, fired as LangGraph fires them.

When a run's config has LangChain callback handlers (a tracer such as LangSmith's, or the
one ``astream_events`` adds), the graph is one chain run named after the graph, each task
a child chain run named after its node (tagged ``graph:step:N``, with the task's
``langgraph_*`` metadata), and whatever the node calls with its config — chat models,
tools, runnables — nests under its task. Handlers are live objects: a task on a worker
reports to a relay that sends its callbacks back to them (``callback_relay.py``). Nothing
here imports langchain-core unless a config has callbacks and langchain-core is installed.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class TracedRun:
    """One chain run reported to LangChain callback handlers."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    @classmethod
    def start(
        cls,
        config: Mapping[str, Any],
        name: str,
        inputs: Any,
        *,
        tags: Sequence[str] = (),
        run_id: uuid.UUID | None = None,
        extra: Sequence[Any] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> TracedRun | None:
        """Start a run of ``name`` under ``config``'s callbacks (plus ``extra`` handlers);
        None when there are none or langchain-core is missing (nothing to report to)."""
        callbacks = config.get("callbacks")
        if not callbacks or importlib.util.find_spec("langchain_core") is None:
            return None
        from langchain_core.callbacks.manager import CallbackManager

        manager = CallbackManager.configure(
            inheritable_callbacks=callbacks,
            local_tags=list(tags) or None,
            inheritable_metadata={**(config.get("metadata") or {}), **(metadata or {})},
        )
        # The config's tags after the run's own, as LangGraph's tasks have them.
        manager.add_tags(list(config.get("tags") or ()))
        for handler in extra:  # the task's stream handlers: its chat models report to them
            manager.add_handler(handler, inherit=True)
        # LangChain's chain-start payload: inputs as a dict, as runnables report theirs.
        return cls(manager.on_chain_start(None, inputs, name=name, run_id=run_id))

    def child(self, tag: str | None = None) -> Any:
        """The callbacks of what this run calls (they report as its children, ``tag``
        added to theirs)."""
        return self.manager.get_child(tag)

    def streamed(self, chunk: Any) -> None:
        """Report ``chunk`` as output this run streamed (to handlers that follow streams)."""
        from langchain_core.tracers._streaming import _StreamingCallbackHandler

        for handler in self.manager.handlers:
            if isinstance(handler, _StreamingCallbackHandler):
                for _ in handler.tap_output_iter(self.manager.run_id, iter([chunk])):
                    pass

    def end(self, output: Any) -> None:
        """The run finished with ``output``."""
        self.manager.on_chain_end(output)

    def error(self, exc: BaseException) -> None:
        """The run ended with ``exc``."""
        self.manager.on_chain_error(exc)


class RunCallbacks:
    """What one run reports to the handlers in its config: itself as a chain run (its tasks
    as children, ``TracedRun``) and, to ``bulksync.callbacks.GraphCallbackHandler``s, its
    pauses and resumes. Without handlers every method does nothing."""

    def __init__(
        self,
        config: dict[str, Any],
        name: str,
        input: Any,
        relay: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.lifecycle = lifecycle_handlers(config)
        self.relay = relay
        """Also hears the pauses and resumes, as ``lifecycle_record``s (a service hands them
        to a remote caller's handlers)."""
        self.traced = TracedRun.start(
            config,
            config.get("run_name") or name,
            input,
            run_id=config.get("run_id"),
            metadata={"ls_integration": "langgraph"},  # as LangGraph tags its runs
        )
        self.run_id = self.traced.manager.run_id if self.traced is not None else None
        if self.traced is not None:  # the run's tasks report under it
            config["callbacks"] = self.traced.child()

    def on_resume(self) -> Callable[[str], None] | None:
        """For ``RunOptions.on_resume``: tell lifecycle handlers the run resumed."""
        if not self.lifecycle and self.relay is None:
            return None

        def resumed(checkpoint_id: str) -> None:
            self._tell(lifecycle_record("resume", "pending", checkpoint_id))

        return resumed

    def paused(self, status: str, checkpoint_id: str, interrupts: Sequence[Any]) -> None:
        """The run paused (on interrupts, or a breakpoint when ``status`` says so)."""
        if interrupts or status.startswith("interrupt"):
            # LangGraph's statuses: a breakpoint's own, "pending" for a node's interrupt.
            shown = status if status in ("interrupt_before", "interrupt_after") else "pending"
            self._tell(lifecycle_record("interrupt", shown, checkpoint_id, interrupts))

    def _tell(self, record: dict[str, Any]) -> None:
        if self.relay is not None:
            self.relay(record)
        if self.lifecycle:
            announce_record(self.lifecycle, record, self.run_id)

    def ended(self, output: Any) -> None:
        """The run finished (or paused) with ``output``."""
        if self.traced is not None:
            self.traced.end(output)

    def failed(self, exc: BaseException) -> None:
        """The run ended with ``exc`` (a caller stopping it: ``CancelledError``)."""
        if self.traced is not None:
            self.traced.error(exc)


def lifecycle_record(
    event: str, status: str, checkpoint_id: str, interrupts: Sequence[Any] = ()
) -> dict[str, Any]:
    """A run's pause (``event="interrupt"``) or resumption (``"resume"``) as plain data: what
    ``announce_record`` turns into a ``bulksync.callbacks`` event, here or in a remote
    caller's process."""
    return {
        "event": event,
        "status": status,
        "checkpoint_id": checkpoint_id,
        "interrupts": list(interrupts),
    }


def announce_record(handlers: Sequence[Any], record: Mapping[str, Any], run_id: Any) -> None:
    """Call the lifecycle ``handlers`` with the event ``record`` describes (raises what a
    handler with ``raise_error`` raises)."""
    from bulksync.callbacks import GraphInterruptEvent, GraphResumeEvent, announce

    status, checkpoint_id = record["status"], record["checkpoint_id"]
    event: Any
    if record["event"] == "interrupt":
        interrupts = tuple(record["interrupts"])
        event = GraphInterruptEvent(run_id, status, checkpoint_id, (), interrupts)
    else:
        event = GraphResumeEvent(run_id, status, checkpoint_id, ())
    announce(list(handlers), event)


def lifecycle_handlers(config: Mapping[str, Any]) -> list[Any]:
    """The graph lifecycle handlers (``bulksync.callbacks``) among a config's callbacks.

    A handler can only be one if that module is loaded, so a run without them never loads
    it (nor langchain-core)."""
    if not config.get("callbacks") or "bulksync.callbacks" not in sys.modules:
        return []
    from bulksync.callbacks import graph_handlers

    return list(graph_handlers(config))


def with_handlers(callbacks: Any, handlers: Sequence[Any]) -> Any:
    """``callbacks`` (a list of handlers, a callback manager or None) plus ``handlers``,
    inherited by whatever the callbacks are handed to."""
    if not handlers:
        return callbacks
    if callbacks is None or isinstance(callbacks, list | tuple):
        return [*(callbacks or ()), *handlers]
    manager = callbacks.copy()
    for handler in handlers:
        manager.add_handler(handler, inherit=True)
    return manager
