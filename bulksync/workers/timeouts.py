"""Timed attempts: an async node or ``@task`` call stopped when it outruns its ``TimeoutPolicy``.

An attempt with a policy runs its coroutine as a task of its event loop, watched by the
attempt's ``AttemptClock``: once ``run_timeout`` seconds have passed since it started, or
``idle_timeout`` seconds since its last progress, the coroutine is cancelled and the attempt
fails with ``NodeTimeoutError`` — retried by the node's retry policy and handled by its error
handler like any failure. ``runtime.heartbeat()`` is progress; under ``refresh_on="auto"``
so are a custom stream write, a ``@task`` call started and any LangChain callback event of
what the node calls (a chat model's tokens: ``progress_handler``). Once the clock has
stopped, the attempt's late stream writes are dropped. Only a coroutine can be stopped,
which is why a sync node's timeout is refused when its graph compiles. The same code runs
in-process and on cluster workers.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from bulksync.errors import NodeTimeoutError
from bulksync.types import TimeoutPolicy


class AttemptClock:
    """When one attempt started and last made progress; whether it is still allowed to run."""

    __slots__ = ("active", "last", "policy", "started")

    def __init__(self, policy: TimeoutPolicy) -> None:
        self.policy = policy
        self.started = self.last = time.monotonic()
        self.active = True

    def heartbeat(self) -> None:
        """Explicit progress (``runtime.heartbeat()``): counts under either ``refresh_on``."""
        self.last = time.monotonic()

    def progress(self) -> None:
        """Progress the attempt showed by working (counts under ``refresh_on="auto"``)."""
        if self.policy.refresh_on == "auto":
            self.last = time.monotonic()

    def guard(self, write: Callable[[Any], None]) -> Callable[[Any], None]:
        """``write`` (a stream writer) counting as progress, and dropped once time is up."""

        def guarded(chunk: Any) -> None:
            if self.active:
                self.progress()
                write(chunk)

        return guarded

    def deadline(self) -> tuple[float, Literal["idle", "run"]]:
        """The monotonic time at which the attempt times out next, and which limit that is."""
        run, idle = self.policy.run_timeout, self.policy.idle_timeout
        ends: list[tuple[float, Literal["idle", "run"]]] = []
        if run is not None:
            ends.append((self.started + float(run), "run"))  # type: ignore[arg-type]
        if idle is not None:
            ends.append((self.last + float(idle), "idle"))  # type: ignore[arg-type]
        return min(ends)

    def expired(self, name: str, kind: Literal["idle", "run"]) -> NodeTimeoutError:
        """Stop the clock; the error of the attempt of ``name`` that ran out of ``kind``."""
        self.active = False
        return NodeTimeoutError(
            name,
            time.monotonic() - self.started,
            kind,
            idle_timeout=_seconds(self.policy.idle_timeout),
            run_timeout=_seconds(self.policy.run_timeout),
        )


async def run_timed(awaitable: Awaitable[Any], clock: AttemptClock, name: str) -> Any:
    """Await ``awaitable`` within ``clock``'s limits.

    Raises:
        NodeTimeoutError: a limit passed first; the coroutine has been cancelled (however
            it handles that, its result no longer counts).
    """
    work = asyncio.ensure_future(awaitable)
    try:
        while True:
            at, kind = clock.deadline()
            left = at - time.monotonic()
            if left <= 0:
                error = clock.expired(name, kind)
                work.cancel()
                work.add_done_callback(_retrieve)
                raise error
            done, _ = await asyncio.wait({work}, timeout=left)
            if done:
                return work.result()
    except asyncio.CancelledError:  # the caller was cancelled: the work goes with it
        work.cancel()
        raise
    finally:
        clock.active = False


def progress_handler(clock: AttemptClock) -> Any | None:
    """A LangChain callback handler counting every event as the attempt's progress (None
    without langchain-core: nothing can report callbacks then)."""
    if clock.policy.refresh_on != "auto" or clock.policy.idle_timeout is None:
        return None
    handler_class = _handler_class()
    return None if handler_class is None else handler_class(clock)


@functools.cache
def _handler_class() -> type | None:
    if importlib.util.find_spec("langchain_core") is None:
        return None
    from langchain_core.callbacks import BaseCallbackHandler

    def touch(self: Any, *args: Any, **kwargs: Any) -> None:
        self.clock.progress()

    events = [name for name in dir(BaseCallbackHandler) if name.startswith("on_")]
    body: dict[str, Any] = {name: touch for name in events}
    body["run_inline"] = True  # in event order, on the thread that reports it

    def init(self: Any, clock: AttemptClock) -> None:
        BaseCallbackHandler.__init__(self)
        self.clock = clock

    body["__init__"] = init
    return type("IdleProgressHandler", (BaseCallbackHandler,), body)


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _retrieve(work: asyncio.Future[Any]) -> None:
    """Mark a cancelled attempt's outcome as seen (asyncio logs unseen errors)."""
    if not work.cancelled():
        work.exception()


__all__ = ["AttemptClock", "progress_handler", "run_timed"]
