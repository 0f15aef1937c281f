"""The async twins of a graph's methods, derived from the sync ones (one implementation each).

``CompiledStateGraph`` and ``RemoteGraph`` both offer LangGraph's async API (``ainvoke``,
``astream``, ``aget_state``, …). Each twin runs its sync method on a worker thread — a run
already runs on threads of its own, and a saver or a cluster call blocks — so the event loop
is never blocked and no behaviour is kept twice by hand. The run's async nodes run on the
caller's event loop all the same (``cancel_scope.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bulksync.stream.events import EventStreamMethods
from bulksync.workers.cancel_scope import CancelScope, scoped_context

_DONE = object()


async def in_threads(items: Iterable[Any]) -> AsyncIterator[Any]:
    """``items`` for async callers: each next item is taken on a worker thread, so a sync
    iterator that blocks (a run, a saver read) never blocks the event loop.

    A run started while taking them belongs to a ``CancelScope`` cancelled if the caller
    stops early (breaks off, is cancelled): the run stops and its async nodes are cancelled.
    """
    it = iter(items)
    loop = asyncio.get_running_loop()
    scope, context = scoped_context(home=loop)  # the run's async nodes run on this loop
    ended = False
    pulling: asyncio.Future[Any] | None = None
    try:
        while True:
            pull = functools.partial(context.run, _unless_stopped, scope, next, it, _DONE)
            pulling = loop.run_in_executor(None, pull)
            item = await asyncio.shield(pulling)  # cancelled: the pull still ends (below)
            pulling = None
            if item is _DONE:
                ended = True
                return
            yield item
    finally:
        if not ended:
            await loop.run_in_executor(None, scope.cancel)  # it waits for cancelled nodes
            close = getattr(it, "close", None)
            if pulling is None and close is not None:  # (a pull in flight ends by itself)
                await loop.run_in_executor(None, context.run, close)


async def in_thread(func: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``func(*args, **kw)`` on a worker thread; a run it starts stops if the caller is
    cancelled (see ``in_threads``)."""
    scope, context = scoped_context(home=asyncio.get_running_loop())
    call = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(context.run, _unless_stopped, scope, func, *args, **kw)
    )
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.get_running_loop().run_in_executor(None, scope.cancel)
        raise


def _per_input(
    config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, count: int
) -> list[Mapping[str, Any] | None]:
    """``batch``'s config for each of ``count`` inputs.

    Raises:
        ValueError: a list of configs that does not match the inputs one to one.
    """
    if config is None or isinstance(config, Mapping):
        return [config] * count
    if len(config) != count:
        raise ValueError(
            f"batch() got {len(config)} configs for {count} inputs: pass one config for "
            "all inputs, or one per input."
        )
    return list(config)


def _unless_stopped(scope: CancelScope, func: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``func(*args, **kw)``; once the caller stopped (``scope`` cancelled), how the stopped
    run ends is nobody's business: its error is dropped rather than left unread."""
    try:
        return func(*args, **kw)
    except Exception:
        if scope.cancelled:
            return _DONE
        raise


class AsyncGraphMethods(EventStreamMethods):
    """Mixin: LangGraph's async graph methods over the class's sync ones (and the event
    streams over ``stream``)."""

    if TYPE_CHECKING:  # what the mixin needs of the class it is mixed into

        def invoke(self, input: Any, config: Mapping[str, Any] | None = ..., **kw: Any) -> Any: ...

        def stream(
            self, input: Any, config: Mapping[str, Any] | None = ..., **kw: Any
        ) -> Iterator[Any]: ...

        def get_state(self, config: Mapping[str, Any], *, subgraphs: bool = ...) -> Any: ...

        def get_state_history(
            self,
            config: Mapping[str, Any],
            *,
            filter: Mapping[str, Any] | None = ...,
            before: Mapping[str, Any] | None = ...,
            limit: int | None = ...,
        ) -> Iterator[Any]: ...

        def update_state(
            self,
            config: Mapping[str, Any],
            values: Any,
            as_node: str | None = ...,
            task_id: str | None = ...,
        ) -> dict[str, Any]: ...

        def bulk_update_state(
            self, config: Mapping[str, Any], supersteps: Sequence[Sequence[Any]]
        ) -> dict[str, Any]: ...

    async def ainvoke(self, input: Any, config: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        """``invoke`` for async callers."""
        return await in_thread(self.invoke, input, config, **kw)

    def astream(
        self, input: Any, config: Mapping[str, Any] | None = None, **kw: Any
    ) -> AsyncIterator[Any]:
        """``stream`` for async callers."""
        return in_threads(self.stream(input, config, **kw))

    def batch(
        self,
        inputs: Sequence[Any],
        config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        return_exceptions: bool = False,
        **kw: Any,
    ) -> list[Any]:
        """``invoke`` on each input, all at once (LangChain's Runnable ``batch``): ``config``
        is one for all or one per input; ``return_exceptions`` puts a failed run's error in
        its place instead of raising the first."""
        configs = _per_input(config, len(inputs))

        def one(value: Any, conf: Mapping[str, Any] | None) -> Any:
            try:
                return self.invoke(value, conf, **kw)
            except Exception as exc:
                if return_exceptions:
                    return exc
                raise

        if not inputs:
            return []
        # Each run on a thread of its own, in the caller's context (a node's, if in one).
        with concurrent.futures.ThreadPoolExecutor(min(len(inputs), 32)) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, one, value, conf)
                for value, conf in zip(inputs, configs, strict=True)
            ]
            return [f.result() for f in futures]

    async def abatch(
        self,
        inputs: Sequence[Any],
        config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        return_exceptions: bool = False,
        **kw: Any,
    ) -> list[Any]:
        """``batch`` for async callers (each run an ``ainvoke``)."""
        configs = _per_input(config, len(inputs))
        runs = (self.ainvoke(v, c, **kw) for v, c in zip(inputs, configs, strict=True))
        return list(await asyncio.gather(*runs, return_exceptions=return_exceptions))

    async def aget_state(self, config: Mapping[str, Any], *, subgraphs: bool = False) -> Any:
        """``get_state`` for async callers."""
        return await asyncio.to_thread(self.get_state, config, subgraphs=subgraphs)

    def aget_state_history(self, config: Mapping[str, Any], **kw: Any) -> AsyncIterator[Any]:
        """``get_state_history`` for async callers."""
        return in_threads(self.get_state_history(config, **kw))

    async def aupdate_state(
        self,
        config: Mapping[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> dict[str, Any]:
        """``update_state`` for async callers."""
        return await asyncio.to_thread(self.update_state, config, values, as_node, task_id)

    async def abulk_update_state(
        self, config: Mapping[str, Any], supersteps: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        """``bulk_update_state`` for async callers."""
        return await asyncio.to_thread(self.bulk_update_state, config, supersteps)
