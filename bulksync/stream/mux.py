"""The v3 event pipeline: protocol events, the transformer contract, and the mux that runs it.

Each part a run streams (``stream(..., version="v2", subgraphs=True)``) becomes a
``ProtocolEvent`` and goes through the mux: every registered ``StreamTransformer`` sees it in
order (a transformer returning False keeps it off the main log), then it is appended to the
main log with the next ``seq``. Transformers publish what they derive as *projections*
(``init()`` returns them); ``StreamChannel`` projections are bound to the mux's lane, closed
or failed with the run, and — when named — forwarded to the main log on every push.

A mux built from factories can make a child mux for a subgraph's scope (fresh transformers,
the same pump); only the root numbers events (``seq``), so children share event objects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, ClassVar, Literal, NotRequired, TypedDict

from bulksync.stream.channel import StreamChannel

logger = logging.getLogger(__name__)


class ProtocolEventParams(TypedDict):
    """What an event carries: the namespace it comes from, a wall-clock stamp in
    milliseconds (not for ordering: use ``seq``), its data, and a values event's interrupts."""

    namespace: list[str]
    timestamp: int
    data: Any
    interrupts: NotRequired[tuple[Any, ...]]


class ProtocolEvent(TypedDict):
    """One event of a v3 stream; ``method`` is the stream mode (or a channel's name)."""

    type: Literal["event"]
    event_id: NotRequired[str]
    seq: NotRequired[int]
    method: str
    params: ProtocolEventParams


def protocol_event(method: str, namespace: Iterable[str], data: Any) -> ProtocolEvent:
    """A new event, stamped now."""
    return {
        "type": "event",
        "method": method,
        "params": {
            "namespace": list(namespace),
            "timestamp": int(time.time() * 1000),
            "data": data,
        },
    }


def event_of_part(part: dict[str, Any]) -> ProtocolEvent:
    """The event of one v2 stream part (``{"type", "ns", "data"}``, values with
    ``interrupts``)."""
    event = protocol_event(part["type"], part["ns"], part["data"])
    if "interrupts" in part:
        event["params"]["interrupts"] = part["interrupts"]
    return event


class StreamTransformer(ABC):
    """A projection of a run's events (LangGraph's ``StreamTransformer`` contract).

    ``init()`` returns the projections (keys of ``run.extensions``; with ``_native = True``
    also attributes of the run stream). ``process(event)`` sees each event (return False to
    keep it off the main log); ``aprocess`` is its async-lane twin. ``finalize``/``fail`` and
    their async twins end the run; channels in the projections are closed or failed by the
    mux anyway. A transformer overriding an async hook, or setting ``requires_async``, only
    runs on the async lane unless it sets ``supports_sync``. ``required_stream_modes`` are
    the modes the run must stream for it; ``before_builtins`` registers it ahead of the
    built-in transformers.
    """

    requires_async: ClassVar[bool] = False
    supports_sync: ClassVar[bool] = False
    required_stream_modes: ClassVar[tuple[str, ...]] = ()
    before_builtins: ClassVar[bool] = False

    def __init__(self, scope: tuple[str, ...] = ()) -> None:
        self.scope: tuple[str, ...] = scope

    @abstractmethod
    def init(self) -> dict[str, Any]:
        """The projections this transformer publishes."""

    def _on_register(self, mux: StreamMux) -> None:  # noqa: B027 (an optional hook)
        """Hook: called once registered (a transformer that makes child muxes keeps ``mux``)."""

    def process(self, event: ProtocolEvent) -> bool:
        """See ``event`` on the sync lane; False keeps it off the main log."""
        raise NotImplementedError(f"{type(self).__name__} must override process() or aprocess()")

    async def aprocess(self, event: ProtocolEvent) -> bool:
        """See ``event`` on the async lane (the next transformer waits for it)."""
        return self.process(event)

    def finalize(self) -> None:  # noqa: B027 (an optional hook)
        """The run ended normally (sync lane)."""

    async def afinalize(self) -> None:
        """The run ended normally (async lane; scheduled work has finished)."""
        self.finalize()

    def fail(self, err: BaseException) -> None:  # noqa: B027 (an optional hook)
        """The run ended with ``err`` (sync lane)."""

    async def afail(self, err: BaseException) -> None:
        """The run ended with ``err`` (async lane; scheduled work was cancelled)."""
        self.fail(err)

    def schedule(
        self, coro: Coroutine[Any, Any, Any], *, on_error: Literal["log", "raise"] = "log"
    ) -> asyncio.Task[Any]:
        """Run ``coro`` alongside the run: the mux awaits it before finalizing and cancels
        it on failure. ``on_error="log"`` logs its exception; ``"raise"`` fails the run.

        Raises:
            RuntimeError: no event loop is running (a sync ``stream_events`` run).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"{type(self).__name__}.schedule() requires a running event loop; this "
                "transformer must run under astream_events(), not stream_events(). Set "
                "requires_async=True on the class so this fails at registration."
            ) from None
        task = asyncio.create_task(_logged(coro) if on_error == "log" else coro)
        pending = self._scheduled()
        pending.add(task)
        task.add_done_callback(pending.discard)
        return task

    def _scheduled(self) -> set[asyncio.Task[Any]]:
        # Kept on the instance lazily: subclasses need not call ``super().__init__()``.
        pending: set[asyncio.Task[Any]] | None = self.__dict__.get("_stream_scheduled_tasks")
        if pending is None:
            pending = self.__dict__["_stream_scheduled_tasks"] = set()
        return pending


async def _logged(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except asyncio.CancelledError:
        raise
    except BaseException:
        logger.exception("A scheduled StreamTransformer task failed")
        return None


def needs_async(transformer: StreamTransformer) -> bool:
    """Whether ``transformer`` can only run on the async lane."""
    if transformer.requires_async:
        return True
    if transformer.supports_sync:
        return False
    cls = type(transformer)
    return any(
        getattr(cls, hook) is not getattr(StreamTransformer, hook)
        for hook in ("aprocess", "afinalize", "afail")
    )


TransformerFactory = Callable[[tuple[str, ...]], StreamTransformer]
"""Builds a transformer for a scope; a transformer class is one."""


class StreamMux:
    """Routes a run's events through its transformers into the main log (module docstring).

    ``extensions`` merges every transformer's projections; ``native_keys`` are those of
    ``_native`` transformers.

    Raises:
        RuntimeError: an async-only transformer on a sync mux.
        TypeError: a transformer's ``init()`` returned something other than a dict.
        ValueError: two transformers publish the same projection key.
    """

    def __init__(
        self,
        transformers: list[StreamTransformer] | None = None,
        *,
        is_async: bool = False,
        factories: list[TransformerFactory] | None = None,
        scope: tuple[str, ...] = (),
        _assign_seq: bool = True,
    ) -> None:
        self.is_async = is_async
        self.scope = scope
        self._assign_seq = _assign_seq
        self._events: StreamChannel[ProtocolEvent] = StreamChannel()
        self._events._bind(is_async=is_async)
        self._events._bind_mux(self)
        self._transformers: list[StreamTransformer] = []
        self._channels: list[StreamChannel[Any]] = []
        self._seq = 0
        self._push_seq = 0
        self.extensions: dict[str, Any] = {}
        self.native_keys: set[str] = set()
        self._owners: dict[str, StreamTransformer] = {}
        self._factories = list(factories) if factories is not None else None
        self._pump_fn: Callable[[], bool] | None = None
        self._apump_fn: Callable[[], Awaitable[bool]] | None = None
        built = [factory(scope) for factory in self._factories or ()]
        for group in (built, list(transformers or ())):
            # ``before_builtins`` transformers go first, each lane in the order given.
            for transformer in sorted(group, key=lambda t: not t.before_builtins):
                self._register(transformer)

    def transformer_by_key(self, key: str) -> StreamTransformer | None:
        """The transformer that published projection ``key``."""
        return self._owners.get(key)

    def required_stream_modes(self) -> list[str]:
        """The stream modes the run must produce for these transformers."""
        modes: dict[str, None] = {}
        for transformer in self._transformers:
            modes.update(dict.fromkeys(getattr(transformer, "required_stream_modes", ())))
        return list(modes)

    def _next_push_seq(self) -> int:
        self._push_seq += 1
        return self._push_seq

    def bind_pump(self, fn: Callable[[], bool]) -> None:
        """Let every cursor of this mux (and its future children) drive the run by ``fn``."""
        self._pump_fn = fn
        for channel in (self._events, *self._channels):
            channel._request_more = fn
        for transformer in self._transformers:
            if (bind := getattr(transformer, "_bind_pump", None)) is not None:
                bind(fn)

    def bind_apump(self, fn: Callable[[], Awaitable[bool]]) -> None:
        """The async twin of ``bind_pump``."""
        self._apump_fn = fn
        for channel in (self._events, *self._channels):
            channel._arequest_more = fn
        for transformer in self._transformers:
            if (bind := getattr(transformer, "_bind_apump", None)) is not None:
                bind(fn)

    def _make_child(self, scope: tuple[str, ...]) -> StreamMux:
        """A mux for a subgraph at ``scope``: fresh transformers from the same factories,
        driven by this mux's pump, not numbering its events.

        Raises:
            RuntimeError: this mux was built from transformer instances, not factories.
        """
        if self._factories is None:
            raise RuntimeError(
                "StreamMux._make_child requires the mux to be constructed with `factories=`; "
                "pre-built transformers can't be cloned to a new scope."
            )
        child = StreamMux(
            factories=self._factories, is_async=self.is_async, scope=scope, _assign_seq=False
        )
        if self._pump_fn is not None:
            child.bind_pump(self._pump_fn)
        if self._apump_fn is not None:
            child.bind_apump(self._apump_fn)
        return child

    def _register(self, transformer: StreamTransformer) -> None:
        name = type(transformer).__name__
        if needs_async(transformer) and not self.is_async:
            raise RuntimeError(
                f"{name} requires an async run — it overrides aprocess/afinalize/afail or "
                "sets requires_async=True. Use astream_events(), not stream_events()."
            )
        projection = transformer.init()
        if not isinstance(projection, dict):
            raise TypeError(
                f"StreamTransformer.init() must return a dict, got {type(projection).__name__}"
            )
        clash = sorted(set(projection) & set(self.extensions))
        if clash:
            owners = ", ".join(f"{k!r} (owned by {type(self._owners[k]).__name__})" for k in clash)
            raise ValueError(
                f"Transformer {name} returned projection keys that conflict with "
                f"already-registered keys: {owners}"
            )
        native = bool(getattr(transformer, "_native", False))
        self._transformers.append(transformer)
        for value in projection.values():
            if isinstance(value, StreamChannel):
                self._adopt(value, native=native)
        self.extensions.update(projection)
        self._owners.update(dict.fromkeys(projection, transformer))
        if native:
            self.native_keys.update(projection)
        transformer._on_register(self)

    def _adopt(self, channel: StreamChannel[Any], *, native: bool) -> None:
        """Bind a projection channel to this mux; a named one forwards its pushes."""
        channel._bind(is_async=self.is_async)
        channel._bind_mux(self)
        self._channels.append(channel)
        if channel.name is not None:
            method = channel.name if native else f"custom:{channel.name}"
            channel._wire(lambda item: self._forward(method, item))

    def _forward(self, method: str, item: Any) -> None:
        """Append a channel push to the main log (past the transformers: a transformer
        pushing while processing must not see its own push again)."""
        self._append(protocol_event(method, (), item))

    def _append(self, event: ProtocolEvent) -> None:
        # Numbered when it enters the log, so events forwarded while it was being
        # processed come first in ``seq`` too.
        if self._assign_seq:
            self._seq += 1
            event["seq"] = self._seq
        self._events.push(event)

    def push(self, event: ProtocolEvent) -> None:
        """Route ``event`` through the transformers (sync lane), then into the main log
        unless one of them kept it out."""
        keep = True
        for transformer in self._transformers:
            keep = transformer.process(event) and keep
        if keep:
            self._append(event)

    async def apush(self, event: ProtocolEvent) -> None:
        """``push`` on the async lane: each transformer's ``aprocess`` is awaited in turn."""
        keep = True
        for transformer in self._transformers:
            keep = await transformer.aprocess(event) and keep
        if keep:
            self._append(event)

    def _end_channels(self, err: BaseException | None) -> None:
        for channel in self._channels:
            if not channel._closed:
                channel.close() if err is None else channel.fail(err)
        if not self._events._closed:
            self._events.close() if err is None else self._events.fail(err)

    def close(self) -> None:
        """The run ended: finalize every transformer, close every channel; the first
        ``finalize`` error is raised once all is closed."""
        first: BaseException | None = None
        for transformer in self._transformers:
            try:
                transformer.finalize()
            except BaseException as exc:
                first = first or exc
        self._end_channels(None)
        if first is not None:
            raise first

    def fail(self, err: BaseException) -> None:
        """The run failed with ``err``: tell every transformer, fail every channel."""
        for transformer in self._transformers:
            try:
                transformer.fail(err)
            except BaseException:
                logger.warning("%s.fail raised", type(transformer).__name__, exc_info=True)
        self._end_channels(err)

    def _scheduled(self) -> list[asyncio.Task[Any]]:
        return [
            task
            for transformer in self._transformers
            for task in transformer.__dict__.get("_stream_scheduled_tasks", ())
            if not task.done()
        ]

    async def aclose(self) -> None:
        """``close`` on the async lane, once every scheduled task has finished (a task's
        ``on_error="raise"`` failure is raised)."""
        pending = self._scheduled()
        if pending:
            results = await asyncio.gather(*pending, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    raise result
        first: BaseException | None = None
        for transformer in self._transformers:
            try:
                await transformer.afinalize()
            except BaseException as exc:
                first = first or exc
        self._end_channels(None)
        if first is not None:
            raise first

    async def afail(self, err: BaseException) -> None:
        """``fail`` on the async lane, once every scheduled task is cancelled."""
        pending = self._scheduled()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for transformer in self._transformers:
            try:
                await transformer.afail(err)
            except BaseException:
                logger.warning("%s.afail raised", type(transformer).__name__, exc_info=True)
        self._end_channels(err)
