"""Run streams: what ``stream_events(version="v3")`` returns, driven by its reader.

No thread or task runs the graph on the stream's behalf: reading any projection (or the raw
events, or ``output``) pulls the next part from the graph's own stream and pushes it through
the mux — the *pump*. Native projections are attributes (``run.values``, ``run.messages``,
``run.subgraphs``, ``run.lifecycle``…); all are in ``run.extensions`` (read-only).

A subgraph handle (``SubgraphRunStream``) is the same view scoped to one subgraph: its mux
is fed by the parent's ``SubgraphTransformer`` and its cursors drive the root's pump.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, NoReturn

from bulksync.stream.channel import StreamChannel
from bulksync.stream.mux import ProtocolEvent, StreamMux, event_of_part


class _RunView:
    """What both lanes keep: the projections, and the run's last values and interrupts."""

    def __init__(self, mux: StreamMux) -> None:
        self._mux = mux
        self.extensions: Mapping[str, Any] = MappingProxyType(mux.extensions)
        self._exhausted = False
        self._latest: Any = None
        self._interrupted = False
        self._interrupts: list[Any] = []
        self._scope_list = list(mux.scope)
        for key in mux.native_keys:
            setattr(self, key, mux.extensions[key])

    def __getattr__(self, name: str) -> NoReturn:
        # Only reached for names that are not set: say which projections there are.
        mux = self.__dict__.get("_mux")
        registered = ", ".join(sorted(mux.native_keys)) if mux is not None else ""
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r} "
            f"(registered projections: {registered or 'none'})"
        )

    def _observe_event(self, event: ProtocolEvent) -> None:
        """Keep this scope's latest values and any interrupts they carry."""
        params = event["params"]
        if event["method"] != "values" or params["namespace"] != self._scope_list:
            return
        self._latest = params["data"]
        interrupts = params.get("interrupts", ())
        if interrupts:
            self._interrupted = True
            self._interrupts.extend(interrupts)

    def _raise_error(self) -> None:
        if (err := self._mux._events._error) is not None:
            raise err


class GraphRunStream(_RunView):
    """A sync v3 run: iterate it for raw events, or read its projections; ``output``,
    ``interrupted`` and ``interrupts`` run it to the end first (and raise its error)."""

    def __init__(
        self, graph_iter: Iterator[Any] | None, mux: StreamMux, *, wire_pump: bool = True
    ) -> None:
        super().__init__(mux)
        self._graph_iter = graph_iter
        if wire_pump:
            mux.bind_pump(self._pump_next)

    def _pump_next(self) -> bool:
        """Move the run on by one part; False once it has ended (or failed)."""
        if self._exhausted or self._graph_iter is None:
            return False
        try:
            part = next(self._graph_iter)
        except StopIteration:
            self._exhausted = True
            self._mux.close()
            return False
        except Exception as exc:
            self._exhausted = True
            self._mux.fail(exc)
            return False
        event = event_of_part(part)
        self._observe_event(event)
        self._mux.push(event)
        return True

    def _run_to_end(self) -> None:
        while self._pump_next():
            pass
        self._raise_error()

    def abort(self) -> None:
        """Stop the run now (its graph stream is closed, so no further step starts) and
        end every projection. Safe to call twice."""
        if self._exhausted:
            return
        self._exhausted = True
        graph_iter, self._graph_iter = self._graph_iter, None
        # The run is being thrown away: how its stream and projections end does not matter.
        close = getattr(graph_iter, "close", None)
        with contextlib.suppress(Exception):
            if close is not None:
                close()
        with contextlib.suppress(Exception):
            self._mux.close()

    def __enter__(self) -> GraphRunStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()

    @property
    def output(self) -> Any:
        """The run's final values (after running it to the end)."""
        self._run_to_end()
        return self._latest

    @property
    def interrupted(self) -> bool:
        """Whether the run paused on an interrupt (after running it to the end)."""
        self._run_to_end()
        return self._interrupted

    @property
    def interrupts(self) -> list[Any]:
        """The interrupts the run paused on (after running it to the end)."""
        self._run_to_end()
        return self._interrupts

    def __iter__(self) -> Iterator[ProtocolEvent]:
        """The main event log, as the run produces it."""
        return iter(self._mux._events)

    def interleave(self, *names: str) -> Iterator[tuple[str, Any]]:
        """``(name, item)`` from the named projections, in the order they were pushed.

        Raises:
            KeyError: a name is not a projection of this run.
            TypeError: a projection is not a sync ``StreamChannel``.
            RuntimeError: a projection already has a subscriber.
        """
        channels = {name: _claim_for_interleave(self.extensions, name) for name in names}
        try:
            yield from self._interleave(channels)
        finally:
            for channel in channels.values():
                channel._subscribed = False

    def _interleave(self, channels: dict[str, StreamChannel[Any]]) -> Iterator[tuple[str, Any]]:
        open_ = dict(channels)
        while open_:
            for name, channel in list(open_.items()):
                if channel._closed and not channel._items:
                    if channel._error is not None:
                        raise channel._error
                    del open_[name]
            ready = [(ch._items[0][0], name) for name, ch in open_.items() if ch._items]
            if ready:
                name = min(ready)[1]
                yield name, open_[name]._items.popleft()[1]
                continue
            pump = self._mux._pump_fn
            stalled = open_ and (pump is None or not pump())
            if stalled and not any(ch._items or ch._closed for ch in open_.values()):
                return


def _claim_for_interleave(extensions: Mapping[str, Any], name: str) -> StreamChannel[Any]:
    channel = extensions[name]
    if not isinstance(channel, StreamChannel):
        raise TypeError(
            "interleave() requires StreamChannel projections, "
            f"got {type(channel).__name__} for {name!r}"
        )
    if channel._is_async is None:
        raise TypeError(f"StreamChannel {name!r} has not been bound yet.")
    if channel._is_async:
        raise TypeError(
            f"StreamChannel {name!r} is bound to async mode — "
            "sync interleave() cannot consume async channels."
        )
    if channel._subscribed:
        raise RuntimeError(
            f"StreamChannel {name!r} already has a subscriber; use .tee(n) for fan-out."
        )
    channel._subscribed = True
    return channel


class AsyncGraphRunStream(_RunView):
    """An async v3 run: ``async for`` it for raw events, or read its projections;
    ``await run.output()`` (and ``interrupted()``, ``interrupts()``) run it to the end.

    Several readers may wait at once: one of them pulls the next part, the others wait for
    it (then find their item, if it was theirs).
    """

    def __init__(
        self, graph_aiter: AsyncIterator[Any] | None, mux: StreamMux, *, wire_pump: bool = True
    ) -> None:
        super().__init__(mux)
        self._graph_aiter = graph_aiter
        self._pump_cond = asyncio.Condition()
        self._pumping = False
        self._anext_task: asyncio.Future[Any] | None = None
        self._aborting = False
        if wire_pump:
            mux.bind_apump(self._apump_next)

    async def _apump_next(self) -> bool:
        """Move the run on by one part, or wait while another reader does; False once the
        run has ended."""
        async with self._pump_cond:
            if self._exhausted or self._graph_aiter is None:
                return False
            if self._pumping:
                await self._pump_cond.wait()
                return not self._exhausted
            self._pumping = True
        try:
            return await self._pull(self._graph_aiter)
        finally:
            async with self._pump_cond:
                self._pumping = False
                self._pump_cond.notify_all()

    async def _pull(self, graph_aiter: AsyncIterator[Any]) -> bool:
        self._anext_task = asyncio.ensure_future(graph_aiter.__anext__())
        try:
            part = await self._anext_task
        except StopAsyncIteration:
            self._exhausted = True
            await self._mux.aclose()
            return False
        except asyncio.CancelledError:
            if self._aborting:  # ``abort`` cancelled the pull: the run is over, quietly
                self._exhausted = True
                return False
            self._anext_task.cancel()
            raise
        except Exception as exc:
            self._exhausted = True
            await self._mux.afail(exc)
            return False
        finally:
            self._anext_task = None
        event = event_of_part(part)
        self._observe_event(event)
        await self._mux.apush(event)
        return True

    async def _run_to_end(self) -> None:
        while await self._apump_next():
            pass
        self._raise_error()

    async def abort(self) -> None:
        """Stop the run now: a pull in flight is cancelled, the graph stream closed, every
        projection ended. Safe to call twice."""
        async with self._pump_cond:
            if self._exhausted:
                return
            self._exhausted = self._aborting = True
            graph_aiter, self._graph_aiter = self._graph_aiter, None
            pulling = self._anext_task
            self._pump_cond.notify_all()
        # The run is being thrown away: how its stream and projections end does not matter.
        if pulling is not None and not pulling.done():
            pulling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pulling
        aclose = getattr(graph_aiter, "aclose", None)
        with contextlib.suppress(Exception):
            if aclose is not None:
                await aclose()
        with contextlib.suppress(Exception):
            await self._mux.aclose()

    async def __aenter__(self) -> AsyncGraphRunStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.abort()

    async def output(self) -> Any:
        """The run's final values (after running it to the end)."""
        await self._run_to_end()
        return self._latest

    async def interrupted(self) -> bool:
        """Whether the run paused on an interrupt (after running it to the end)."""
        await self._run_to_end()
        return self._interrupted

    async def interrupts(self) -> list[Any]:
        """The interrupts the run paused on (after running it to the end)."""
        await self._run_to_end()
        return self._interrupts

    def __aiter__(self) -> AsyncIterator[ProtocolEvent]:
        """The main event log, as the run produces it."""
        return self._mux._events.__aiter__()


class _SubgraphHandle:
    """A subgraph's identity and how it ended (set by the parent's ``SubgraphTransformer``)."""

    path: tuple[str, ...]
    graph_name: str | None
    trigger_call_id: str | None
    status: str
    error: str | None
    _seen_terminal: bool

    def _identify(
        self, path: tuple[str, ...], graph_name: str | None, trigger_call_id: str | None
    ) -> None:
        self.path = path
        self.graph_name = graph_name
        self.trigger_call_id = trigger_call_id
        self.status = "started"
        self.error = None
        self._seen_terminal = False


class SubgraphRunStream(GraphRunStream, _SubgraphHandle):
    """A sync handle on one subgraph of a run; reading it drives the root run."""

    def __init__(
        self,
        mux: StreamMux,
        *,
        path: tuple[str, ...],
        graph_name: str | None = None,
        trigger_call_id: str | None = None,
    ) -> None:
        self._parent_pump_fn: Callable[[], bool] | None = mux._pump_fn
        super().__init__(None, mux, wire_pump=False)
        self._identify(path, graph_name, trigger_call_id)

    def _pump_next(self) -> bool:
        if self._exhausted or self._seen_terminal or self._mux._events._closed:
            return False
        return self._parent_pump_fn is not None and self._parent_pump_fn()


class AsyncSubgraphRunStream(AsyncGraphRunStream, _SubgraphHandle):
    """An async handle on one subgraph of a run; reading it drives the root run."""

    def __init__(
        self,
        mux: StreamMux,
        *,
        path: tuple[str, ...],
        graph_name: str | None = None,
        trigger_call_id: str | None = None,
    ) -> None:
        self._parent_apump_fn: Callable[[], Awaitable[bool]] | None = mux._apump_fn
        super().__init__(None, mux, wire_pump=False)
        self._identify(path, graph_name, trigger_call_id)

    async def _apump_next(self) -> bool:
        if self._exhausted or self._seen_terminal or self._mux._events._closed:
            return False
        return self._parent_apump_fn is not None and await self._parent_apump_fn()
