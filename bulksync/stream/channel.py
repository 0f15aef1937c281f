"""``StreamChannel``: one projection of a v3 event stream, read by one consumer.

A channel holds only what its subscriber has not read yet: pushes before anyone subscribes
are not kept (nothing piles up for a projection nobody reads), and each item is dropped as it
is read. When the buffer is empty the cursor asks the run for one more event (the *pump*,
installed by the run stream), so the caller's loop drives the graph and memory stays bounded
by the caller's pace. A named channel also forwards each push to its mux's main event log.

A channel is bound once to the sync or the async lane; only that lane's iteration works.
One subscriber each: ``tee(n)`` / ``atee(n)`` fan one channel out to ``n`` readers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from bulksync.stream.mux import StreamMux

T = TypeVar("T")


class StreamChannel(Generic[T]):
    """A single-consumer queue of one projection's items (see the module docstring).

    ``name``, when given, makes the owning mux forward every push to its main log as an
    event of that method (``custom:<name>`` for a transformer that is not native).
    ``maxlen`` is accepted for LangGraph compatibility; the caller-driven pump is what bounds
    memory.
    """

    def __init__(self, name: str | None = None, *, maxlen: int | None = None) -> None:
        if maxlen is not None and maxlen <= 0:
            raise ValueError("StreamChannel maxlen must be a positive int or None")
        self.name = name
        self._maxlen = maxlen
        self._items: deque[tuple[int, T]] = deque()  # (push stamp, item)
        self._closed = False
        self._error: BaseException | None = None
        self._is_async: bool | None = None
        self._subscribed = False
        self._request_more: Callable[[], bool] | None = None
        self._arequest_more: Callable[[], Awaitable[bool]] | None = None
        self._wire_fn: Callable[[T], None] | None = None
        self._mux: StreamMux | None = None

    # -- wiring, done by the mux and the run stream ------------------------------------------

    def _bind(self, *, is_async: bool) -> None:
        """Fix the lane this channel is read on (once)."""
        if self._is_async is not None:
            raise RuntimeError("StreamChannel is already bound")
        self._is_async = is_async

    def _bind_mux(self, mux: StreamMux) -> None:
        self._mux = mux

    def _wire(self, forward: Callable[[T], None]) -> None:
        """Have every push also call ``forward`` (the mux's main-log forwarding)."""
        self._wire_fn = forward

    # -- producing ----------------------------------------------------------------------------

    def push(self, item: T) -> None:
        """Queue ``item`` for the subscriber (if there is one) and forward it if wired.

        Raises:
            RuntimeError: the channel is closed and has a subscriber.
        """
        if self._subscribed:
            if self._closed:
                raise RuntimeError("Cannot push to a closed StreamChannel")
            stamp = self._mux._next_push_seq() if self._mux is not None else 0
            self._items.append((stamp, item))
        if self._wire_fn is not None:
            self._wire_fn(item)

    def close(self) -> None:
        """No more items: the subscriber ends after the ones queued."""
        self._closed = True

    def fail(self, err: BaseException) -> None:
        """No more items: the subscriber gets ``err`` after the ones queued."""
        self._error = err
        self._closed = True

    # -- consuming ----------------------------------------------------------------------------

    def _subscribe(self, *, is_async: bool) -> None:
        lane, other = ("async", "'async for'") if is_async else ("sync", "'for'")
        if self._is_async is None:
            raise TypeError(
                "StreamChannel has not been bound yet. "
                "Register the transformer with a StreamMux first."
            )
        if self._is_async != is_async:
            raise TypeError(
                f"This StreamChannel is bound to {'async' if self._is_async else 'sync'} "
                f"mode — it cannot be read on the {lane} lane; use "
                f"{'async for' if self._is_async else 'for'} instead of {other}."
            )
        if self._subscribed:
            tee = ".atee(n)" if is_async else ".tee(n)"
            raise RuntimeError(f"StreamChannel already has a subscriber; use {tee} for fan-out.")
        self._subscribed = True

    def __iter__(self) -> Iterator[T]:
        """Subscribe on the sync lane (once)."""
        self._subscribe(is_async=False)
        return self._read()

    def __aiter__(self) -> AsyncIterator[T]:
        """Subscribe on the async lane (once)."""
        self._subscribe(is_async=True)
        return self._aread()

    def _next_ready(self) -> tuple[bool, T | None]:
        """``(True, item)`` for a queued item; ``(False, None)`` when the channel is done
        (raising its error, if it failed); ``None`` is never an item signal by itself."""
        if self._items:
            return True, self._items.popleft()[1]
        if self._closed and self._error is not None:
            raise self._error
        return False, None

    def _read(self) -> Iterator[T]:
        while True:
            ready, item = self._next_ready()
            if ready:
                yield item  # type: ignore[misc]
                continue
            if self._closed or self._request_more is None:
                return
            # The pump made no progress and left nothing for us: the run is over.
            if not self._request_more() and not self._items and not self._closed:
                return

    async def _aread(self) -> AsyncIterator[T]:
        while True:
            ready, item = self._next_ready()
            if ready:
                yield item  # type: ignore[misc]
                continue
            if self._closed or self._arequest_more is None:
                return
            if not await self._arequest_more() and not self._items and not self._closed:
                return

    def tee(self, n: int = 2) -> tuple[Iterator[T], ...]:
        """Subscribe once and give ``n`` sync readers that each see every item."""
        if n < 1:
            raise ValueError("tee() requires n >= 1")
        source = iter(self)
        buffers: list[deque[T]] = [deque() for _ in range(n)]
        state = {"done": False}

        def reader(buf: deque[T]) -> Iterator[T]:
            while True:
                if buf:
                    yield buf.popleft()
                    continue
                if state["done"]:
                    return
                try:
                    item = next(source)
                except StopIteration:
                    state["done"] = True
                    return
                for b in buffers:
                    b.append(item)

        return tuple(reader(b) for b in buffers)

    def atee(self, n: int = 2) -> tuple[AsyncIterator[T], ...]:
        """Subscribe once and give ``n`` async readers that each see every item; one of
        them at a time pulls from the channel (a lock), the others wait for its item."""
        if n < 1:
            raise ValueError("atee() requires n >= 1")
        source = self.__aiter__()
        buffers: list[deque[T]] = [deque() for _ in range(n)]
        lock = asyncio.Lock()
        end: dict[str, BaseException | bool | None] = {"done": False, "error": None}

        async def reader(buf: deque[T]) -> AsyncIterator[T]:
            while True:
                if buf:
                    yield buf.popleft()
                    continue
                if end["done"]:
                    if isinstance(end["error"], BaseException):
                        raise end["error"]
                    return
                async with lock:
                    if buf or end["done"]:
                        continue
                    try:
                        item = await source.__anext__()
                    except StopAsyncIteration:
                        end["done"] = True
                        continue
                    except Exception as exc:
                        end["done"], end["error"] = True, exc
                        continue
                    for b in buffers:
                        b.append(item)

        return tuple(reader(b) for b in buffers)
