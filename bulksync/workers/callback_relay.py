"""LangChain callbacks of tasks that run away from the caller's handlers, relayed to them.

Callback handlers are live objects of the process that started the run (a tracer,
``astream_events``' own). A task on a worker, or a run on the coordinator service, reports
instead to a *relay*: a handler that turns each callback (``on_chain_start``, a chat model's
``on_llm_new_token``, a streamed chunk, …) into a plain record and sends it on as a stream
event (``CALLBACK_EVENTS``). Where the handlers live, ``replay`` hands each record to them as
the callback itself would have: same run ids, parents, tags and metadata, so a tracer or
``astream_events(version="v2")`` sees the tasks of a cluster run as those of a local one.

``describe`` says what a relay needs of the handlers it stands for (the parent run, the
inherited tags and metadata, whether one of them follows streams, which makes chat models
stream), in plain data that travels with the step or the run. Nothing here is imported unless
a run has callbacks, and it needs langchain-core (the ``agents`` extra) only then.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bulksync.errors import SerializationError
from bulksync.workers import wire

log = logging.getLogger("bulksync.callbacks")

CALLBACK_EVENTS = "__callback_events__"
"""The stream mode of relayed callback records (never shown to a caller)."""

# Each callback a relay forwards, with the condition under which a handler ignores it.
_IGNORED_WHEN: dict[str, str | None] = {
    "on_llm_start": "ignore_llm",
    "on_chat_model_start": "ignore_chat_model",
    "on_llm_new_token": "ignore_llm",
    "on_llm_end": "ignore_llm",
    "on_llm_error": "ignore_llm",
    "on_chain_start": "ignore_chain",
    "on_chain_end": "ignore_chain",
    "on_chain_error": "ignore_chain",
    "on_agent_action": "ignore_agent",
    "on_agent_finish": "ignore_agent",
    "on_tool_start": "ignore_agent",
    "on_tool_end": "ignore_agent",
    "on_tool_error": "ignore_agent",
    "on_retriever_start": "ignore_retriever",
    "on_retriever_end": "ignore_retriever",
    "on_retriever_error": "ignore_retriever",
    "on_retry": "ignore_retry",
    "on_text": None,
    "on_custom_event": "ignore_custom_event",
}
_STREAMED = "tap_output"
"""The record of a chunk a run streamed (``_StreamingCallbackHandler.tap_output_iter``)."""


def describe(callbacks: Any) -> dict[str, Any] | None:
    """What a relay standing for ``callbacks`` (a config's: handlers or a manager) needs to
    know, as plain data; None when there is nothing to report to."""
    if not callbacks or "langchain_core.callbacks" not in sys.modules:
        return None  # handlers exist only if their process loaded LangChain's callbacks
    from langchain_core.callbacks import BaseCallbackManager

    handlers = _handlers_of(callbacks)
    parent, tags, metadata = None, [], {}
    if isinstance(callbacks, BaseCallbackManager):
        parent, tags = callbacks.parent_run_id, list(callbacks.inheritable_tags)
        metadata = dict(callbacks.inheritable_metadata)
    if not handlers:
        return None
    return {
        "parent_run_id": parent,
        "tags": tags,
        "metadata": {k: v for k, v in metadata.items() if _fits(v)},
        "streaming": any(_follows_streams(h) for h in handlers),
    }


def relay_manager(trace: Mapping[str, Any], emit: Callable[[Any], None]) -> Any:
    """A callback manager whose one (inherited) handler sends every callback to ``emit`` as
    a record, standing for the handlers ``trace`` (from ``describe``) describes."""
    from langchain_core.callbacks import CallbackManager

    relay = _relay_class(bool(trace.get("streaming")))(emit)
    tags, metadata = list(trace.get("tags") or ()), dict(trace.get("metadata") or {})
    return CallbackManager(
        handlers=[relay],
        inheritable_handlers=[relay],
        parent_run_id=trace.get("parent_run_id"),
        tags=list(tags),
        inheritable_tags=tags,
        metadata=dict(metadata),
        inheritable_metadata=metadata,
    )


def replay(callbacks: Any, record: Any, rename: Mapping[str, Any] | None = None) -> None:
    """Hand one relayed callback ``record`` to the handlers ``callbacks`` holds (those a
    task's callbacks would inherit). ``rename`` maps run ids (as text) to the ids the
    handlers know those runs by. A handler's failure is logged, never raised: the task that
    reported it has run on already."""
    if not callbacks:
        return
    from langchain_core.callbacks.manager import handle_event

    handlers = _handlers_of(callbacks)
    method, args, kwargs = record
    args = [_error_in(v) for v in args]
    kwargs = {
        k: _renamed(v, rename) if k.endswith("run_id") else _error_in(v) for k, v in kwargs.items()
    }
    try:
        if method == _STREAMED:
            run_id, chunk = args
            for handler in handlers:
                if _follows_streams(handler):
                    tapped = handler.tap_output_iter(_renamed(run_id, rename), iter([chunk]))
                    for _ in tapped:  # a streaming handler reports the chunk as it passes
                        pass
        elif method in _IGNORED_WHEN:
            handle_event(handlers, method, _IGNORED_WHEN[method], *args, **kwargs)
    except Exception:  # a handler with raise_error: its run on the cluster went on
        log.warning("a callback handler failed on a relayed %s", method, exc_info=True)


def _handlers_of(callbacks: Any) -> list[Any]:
    """The handlers a task's callbacks inherit from ``callbacks`` (handlers or a manager)."""
    from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager

    if isinstance(callbacks, BaseCallbackManager):
        return list(callbacks.inheritable_handlers)
    return [callbacks] if isinstance(callbacks, BaseCallbackHandler) else list(callbacks)


_ERROR_KEY = "__bulksync_error__"


def _error_out(value: Any) -> Any:
    """An error (``on_chain_error``'s, …) as its record, rebuilt with its type on replay."""
    return {_ERROR_KEY: wire.dumps_error(value)} if isinstance(value, BaseException) else value


def _error_in(value: Any) -> Any:
    if type(value) is dict and len(value) == 1 and isinstance(value.get(_ERROR_KEY), bytes):
        return wire.loads_error(value[_ERROR_KEY])
    return value


def _renamed(run_id: Any, rename: Mapping[str, Any] | None) -> Any:
    if not rename or run_id is None:
        return run_id
    return rename.get(str(run_id), run_id)


def _follows_streams(handler: Any) -> bool:
    """Whether LangChain takes ``handler`` for one that follows streams (its chat models
    then stream); the check LangChain makes."""
    from langchain_core.tracers._streaming import _StreamingCallbackHandler

    return isinstance(handler, _StreamingCallbackHandler)


def _fits(value: Any) -> bool:
    try:
        wire.SERDE.dumps(value)
    except SerializationError:
        return False
    return True


def _portable(value: Any) -> Any:
    """``value`` with every part the wire cannot carry replaced by its ``repr``."""
    if _fits(value):
        return value
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_portable(v) for v in value]
    return repr(value)


_RELAYS: dict[bool, type] = {}


def _relay_class(streaming: bool) -> type:
    """The relay handler class (one that follows streams when ``streaming``, so that chat
    models stream as they would for the handlers it stands for)."""
    cls = _RELAYS.get(streaming)
    if cls is not None:
        return cls
    from langchain_core.callbacks import BaseCallbackHandler

    def forward(name: str) -> Callable[..., None]:
        def method(self: Any, *args: Any, **kwargs: Any) -> None:
            self.send(name, args, kwargs)

        method.__name__ = name
        return method

    namespace: dict[str, Any] = {name: forward(name) for name in _IGNORED_WHEN}
    if streaming:  # LangChain's streaming handlers are those with these two methods
        namespace["tap_output_iter"] = _Relay.tapped
        namespace["tap_output_aiter"] = _Relay.atapped
    cls = _RELAYS[streaming] = type("CallbackRelay", (_Relay, BaseCallbackHandler), namespace)
    return cls


class _Relay:
    """The relay's own behaviour: each callback becomes a record sent to ``emit``."""

    run_inline = True  # in order, on the reporting thread
    raise_error = False

    def __init__(self, emit: Callable[[Any], None]) -> None:
        self.emit = emit

    def send(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        shipped = {k: _error_out(v) for k, v in kwargs.items()}
        record = [name, [_error_out(v) for v in args], shipped]
        try:  # encoded once, by whatever sends it on
            self.emit(record)
        except SerializationError:  # (raised before anything is sent)
            self.emit(_portable(record))

    def tapped(self, run_id: Any, output: Iterator[Any]) -> Iterator[Any]:
        for chunk in output:
            self.send(_STREAMED, (run_id, chunk), {})
            yield chunk

    async def atapped(self, run_id: Any, output: Any) -> Any:
        async for chunk in output:
            self.send(_STREAMED, (run_id, chunk), {})
            yield chunk
