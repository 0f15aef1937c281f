"""The ``messages`` stream mode: LLM tokens and new messages, as a node produces them.

When a run streams ``messages``, each task runs with a LangChain callback handler in the
config its node (and every chat model it calls) sees. The handler passes on:

- the tokens of every chat model the node calls — the model streams even when called with
  ``invoke``, since the handler declares itself a streaming one, as LangGraph's does — and
  the finished message of a model that did not stream;
- the messages the node returns that it did not receive (by id), once each.

Each goes to the task's sink as ``(message, metadata)``: the node's ``langgraph_*`` keys plus
the model's own (``ls_provider``, …). On a cluster the sink is the step's inbox, so tokens
reach the caller while the model is still generating. Nothing here imports langchain-core
unless a run asks for ``messages`` and langchain-core is installed; without it the mode
streams nothing, as there are no LangChain chat models to listen to.
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

    def __init__(self, emit: Emit, metadata: dict[str, Any]) -> None:
        self.emit = emit
        # LangSmith's integration tag, which LangGraph sets on every run's callbacks.
        self.metadata = {"ls_integration": "langgraph", **metadata}
        self.seen: set[str] = set()
        self.handler = _handler_class()(self)

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
        """Emit the messages of a node's output (its Commands' updates too) not seen yet."""
        for message in _messages_in(output):
            self.pass_on(message, dict(self.metadata), once=True)


def message_stream(modes: Any, emit: Emit, metadata: dict[str, Any]) -> MessageStream | None:
    """A task's ``MessageStream`` when its run streams ``messages`` and langchain-core is
    installed; None otherwise (then nothing is listened to)."""
    if "messages" not in modes or importlib.util.find_spec("langchain_core") is None:
        return None
    return MessageStream(emit, metadata)


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


def _handler_class() -> type[Any]:
    """The callback handler class (built on first use: it subclasses langchain-core's)."""
    global _HANDLER
    if _HANDLER is None:
        _HANDLER = _build_handler()
    return _HANDLER


_HANDLER: type[Any] | None = None


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
                self.runs[run_id] = {**self.stream.metadata, **(metadata or {})}

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
