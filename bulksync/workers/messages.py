"""The ``messages`` stream mode: LLM tokens and new messages, as a node produces them.

When a run streams ``messages``, each task runs with a LangChain callback handler in the
config its node (and every chat model it calls) sees. The handler passes on:

- the tokens of every chat model the node calls — the model streams even when called with
  ``invoke``, since the handler declares itself a streaming one, as LangGraph's does — and
  the finished message of a model that did not stream;
- the messages the node returns that it did not receive (by id), once each.

Each goes to the task's sink as ``(message, metadata)``: the node's ``langgraph_*`` keys plus
the model's own (``ls_provider``, …). A ``stream_events(version="v3")`` run (its config has
``MESSAGE_EVENTS``) gets a model's reply as LangChain's content-block events instead of
token chunks — ``(event, metadata)`` with the model call's ``run_id`` in the metadata, which
``stream/messages.py`` reassembles — and no tool messages among a node's returned ones.

On a cluster the sink is the step's inbox, so tokens reach the caller while the model is
still generating. Nothing here imports langchain-core unless a run asks for ``messages`` and
langchain-core is installed; without it the mode streams nothing, as there are no LangChain
chat models to listen to.
"""

from __future__ import annotations

import contextlib
import importlib.util
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

Emit = Callable[[Any, dict[str, Any]], None]
"""Passes one ``(message, metadata)`` chunk on to the run's stream."""

_NO_STREAM_TAG = "nostream"
"""A chat model tagged so (``model.with_config(tags=["nostream"])``) is not streamed."""


class MessageStream:
    """One task's view of the ``messages`` mode: its handler and what it has passed on."""

    def __init__(self, emit: Emit, metadata: dict[str, Any], *, events: bool = False) -> None:
        self.emit = emit
        # LangSmith's integration tag, which LangGraph sets on every run's callbacks.
        self.metadata = {"ls_integration": "langgraph", **metadata}
        self.seen: set[str] = set()
        self.events = events
        self.handler = _handler_class(events)(self)

    def pass_on(self, message: Any, metadata: dict[str, Any], *, once: bool) -> None:
        """Emit ``message`` (``once``: unless a message with its id was seen already)."""
        if once and message.id in self.seen:
            return
        if message.id is None:
            message.id = str(uuid.uuid4())
        self.seen.add(message.id)
        self.emit(message, metadata)

    def saw_input(self, value: Any) -> None:
        """Remember the ids of the messages in a node's input: returning them is no news."""
        for message in _messages_in(value):
            if message.id is not None:
                self.seen.add(message.id)

    def node_output(self, output: Any) -> None:
        """Emit the messages of a node's output (its Commands' updates too) not seen yet
        (with content-block events, tool results are not chat replies: left out)."""
        for message in _messages_in(output):
            if not (self.events and getattr(message, "type", None) == "tool"):
                self.pass_on(message, dict(self.metadata), once=True)


def message_stream(
    modes: Any, emit: Emit, metadata: dict[str, Any], *, events: bool = False
) -> MessageStream | None:
    """A task's ``MessageStream`` when its run streams ``messages`` and langchain-core is
    installed; None otherwise (then nothing is listened to). ``events``: content-block
    events rather than token chunks."""
    if "messages" not in modes or importlib.util.find_spec("langchain_core") is None:
        return None
    return MessageStream(emit, metadata, events=events)


@contextlib.contextmanager
def listening(config: dict[str, Any]) -> Iterator[None]:
    """While the node runs, hand chat models and tools called without a config the task's
    callback handlers (``messages``, ``tools`` modes) and metadata, as LangChain hands a
    parent runnable's config to its children."""
    if not config.get("callbacks") or importlib.util.find_spec("langchain_core") is None:
        yield
        return
    from langchain_core.runnables.config import RunnableConfig, var_child_runnable_config

    token = var_child_runnable_config.set(cast("RunnableConfig", config))
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)


def _messages_in(value: Any) -> Iterator[Any]:
    """The LangChain messages in a node's input or output: directly, in a list, in a dict's
    values (or their lists), in a Command's update."""
    from langchain_core.messages import BaseMessage

    if isinstance(value, BaseMessage):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _messages_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            if isinstance(item, BaseMessage | list | tuple):
                yield from _messages_in(item)
    elif hasattr(value, "update") and hasattr(value, "goto"):  # a Command
        yield from _messages_in(value.update)


def _handler_class(events: bool) -> type[Any]:
    """The callback handler class (built on first use: it subclasses langchain-core's)."""
    if not _HANDLERS:
        _HANDLERS[False] = _build_handler()
        _HANDLERS[True] = _build_event_handler(_HANDLERS[False])
    return _HANDLERS[events]


_HANDLERS: dict[bool, type[Any]] = {}


def _build_handler() -> type[Any]:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk
    from langchain_core.tracers._streaming import _StreamingCallbackHandler

    class TaskMessages(BaseCallbackHandler, _StreamingCallbackHandler):  # type: ignore[type-arg]
        """Passes a task's chat-model tokens and finished messages on to its stream."""

        run_inline = True  # on the node's thread, in order

        def __init__(self, stream: MessageStream) -> None:
            self.stream = stream
            self.runs: dict[uuid.UUID, dict[str, Any]] = {}

        def tap_output_iter(self, run_id: uuid.UUID, output: Any) -> Any:
            return output

        def tap_output_aiter(self, run_id: uuid.UUID, output: Any) -> Any:
            return output

        def on_chat_model_start(
            self,
            serialized: Any,
            messages: Any,
            *,
            run_id: uuid.UUID,
            tags: list[str] | None = None,
            metadata: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            if _NO_STREAM_TAG not in (tags or ()):
                meta = {**self.stream.metadata, **(metadata or {})}
                # The caller's tags (and the model's own), not LangGraph's step bookkeeping.
                user_tags = [t for t in tags or () if not t.startswith("seq:step")]
                if user_tags:
                    meta["tags"] = user_tags
                self.runs[run_id] = meta

        def on_llm_new_token(
            self,
            token: Any,
            *,
            chunk: Any = None,
            run_id: uuid.UUID,
            parent_run_id: uuid.UUID | None = None,
            tags: list[str] | None = None,
            **kwargs: Any,
        ) -> None:
            meta = self.runs.get(run_id)
            if meta is not None and isinstance(chunk, ChatGenerationChunk):
                self.stream.pass_on(chunk.message, dict(meta), once=False)

        def on_llm_end(self, response: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
            meta = self.runs.pop(run_id, None)
            generations = getattr(response, "generations", None)
            if meta is not None and generations and generations[0]:
                first = generations[0][0]
                if isinstance(first, ChatGeneration):
                    self.stream.pass_on(first.message, dict(meta), once=True)

        def on_llm_error(self, error: BaseException, *, run_id: uuid.UUID, **kw: Any) -> None:
            self.runs.pop(run_id, None)

    return TaskMessages


def _build_event_handler(base: type[Any]) -> type[Any]:
    from langchain_core.tracers._streaming import _V2StreamingCallbackHandler

    class TaskMessageEvents(base, _V2StreamingCallbackHandler):  # type: ignore[misc]
        """Passes a task's chat-model replies on as content-block events (declaring itself
        a v2 handler is what makes a model's ``invoke`` produce them)."""

        def __init__(self, stream: MessageStream) -> None:
            super().__init__(stream)
            self.streamed: set[uuid.UUID] = set()

        def on_llm_new_token(self, token: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
            # A model streamed with ``.stream()`` still sends v1 tokens: its events carry
            # the reply already, and tokens would mix two shapes on one stream.
            return None

        def on_stream_event(self, event: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
            meta = self.runs.get(run_id)
            if meta is None:
                return
            self.streamed.add(run_id)
            self.stream.emit(event, {**meta, "run_id": str(run_id)})

        def on_llm_end(self, response: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
            if run_id not in self.streamed:  # no events: the whole reply, once
                super().on_llm_end(response, run_id=run_id, **kwargs)
                return
            self.streamed.discard(run_id)
            self.runs.pop(run_id, None)
            generations = getattr(response, "generations", None)
            message = getattr(generations[0][0], "message", None) if generations else None
            if message is not None:  # its events told it: returning it is no news
                if message.id is None:
                    message.id = str(uuid.uuid4())
                self.stream.seen.add(message.id)

        def on_llm_error(self, error: BaseException, *, run_id: uuid.UUID, **kw: Any) -> None:
            self.streamed.discard(run_id)
            super().on_llm_error(error, run_id=run_id, **kw)

    return TaskMessageEvents
