"""``run.messages``: one LangChain ``ChatModelStream`` per chat-model reply at this scope.

A v3 run's tasks stream their chat models as content-block events (``message-start``,
``content-block-*``, ``message-finish``), each tagged with the model call's ``run_id``
(``workers/messages.py``); the events of one call feed one stream, pushed on its first event
so a reader can follow its text while the model still generates. A message a node returns
whole (an ``AIMessage`` no model streamed) becomes a finished stream. Tool messages are not
chat-model replies and are left out. ``ChatModelStream`` is langchain-core's: without it
installed there are no chat models, and the projection stays empty.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bulksync.stream.channel import StreamChannel
from bulksync.stream.mux import ProtocolEvent, StreamTransformer


class MessagesTransformer(StreamTransformer):
    """The ``messages`` projection (see the module docstring)."""

    _native = True
    required_stream_modes = ("messages",)

    def __init__(self, scope: tuple[str, ...] = ()) -> None:
        super().__init__(scope)
        self._log: StreamChannel[Any] = StreamChannel()
        self._streams: dict[str, Any] = {}  # model call run_id -> its open stream
        self._skipped: set[str] = set()  # model calls that reply as a tool: not shown
        self._pump: Callable[[], bool] | None = None
        self._apump: Callable[[], Awaitable[bool]] | None = None
        self._scope_list = list(scope)

    def init(self) -> dict[str, Any]:
        return {"messages": self._log}

    def _bind_pump(self, fn: Callable[[], bool]) -> None:
        self._pump = fn

    def _bind_apump(self, fn: Callable[[], Awaitable[bool]]) -> None:
        self._apump = fn

    def _new_stream(self, node: str | None, message_id: str | None) -> Any:
        """A stream whose readers drive the run when they run out of events."""
        from langchain_core.language_models.chat_model_stream import (
            AsyncChatModelStream,
            ChatModelStream,
        )

        if self._apump is not None or self._pump is None:
            stream: Any = AsyncChatModelStream(namespace=[], node=node, message_id=message_id)
            if self._apump is not None:
                stream.set_arequest_more(self._apump)
            return stream
        stream = ChatModelStream(namespace=[], node=node, message_id=message_id)
        stream.set_request_more(self._pump)
        return stream

    def process(self, event: ProtocolEvent) -> bool:
        params = event["params"]
        if event["method"] != "messages" or params["namespace"] != self._scope_list:
            return True
        payload, metadata = params["data"]
        metadata = metadata or {}
        node = metadata.get("langgraph_node")
        if isinstance(payload, dict) and "event" in payload:
            self._on_model_event(payload, str(metadata.get("run_id", "")), node)
        elif _is_reply(payload):
            self._on_whole_message(payload, node)
        return True

    def _on_model_event(self, event: dict[str, Any], run_id: str, node: str | None) -> None:
        kind = event.get("event")
        if kind == "message-start":
            if event.get("role") == "tool":
                self._skipped.add(run_id)
                return
            message_id = event.get("message_id")
            stream = self._new_stream(node, None if message_id is None else str(message_id))
            self._streams[run_id] = stream
            self._log.push(stream)
            stream.dispatch(event)
        elif run_id in self._skipped:
            if kind == "message-finish":
                self._skipped.discard(run_id)
        elif (stream := self._streams.get(run_id)) is not None:
            stream.dispatch(event)
            if kind == "message-finish":
                del self._streams[run_id]

    def _on_whole_message(self, message: Any, node: str | None) -> None:
        # langchain-core's replay of a finished message as the events a live call makes.
        from langchain_core.language_models._compat_bridge import message_to_events

        stream = self._new_stream(node, message.id)
        for event in message_to_events(message, message_id=message.id):
            stream.dispatch(event)
        self._log.push(stream)

    def finalize(self) -> None:
        self._streams.clear()
        self._skipped.clear()

    def fail(self, err: BaseException) -> None:
        for stream in self._streams.values():
            stream.fail(err)
        self.finalize()


def _is_reply(payload: Any) -> bool:
    """A whole message a node returned that a chat model could have said (not a token
    chunk, not a tool's result)."""
    try:
        from langchain_core.messages import AIMessageChunk, BaseMessage, ToolMessage
    except ImportError:  # no langchain-core: no LangChain messages either
        return False
    return isinstance(payload, BaseMessage) and not isinstance(
        payload, AIMessageChunk | ToolMessage
    )
