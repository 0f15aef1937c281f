"""``@task``: a function whose calls, made inside a running node, are tasks of their own.

Calling a task returns a future at once (awaitable in a coroutine); the call runs
concurrently with the caller and with other calls (``workers/calls.py`` runs them). Its result
is stored with the caller's step, so a node run again after a pause or a failure gets the
results of the calls that finished without running them again.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from bulksync.context import maybe_current_task
from bulksync.coordinator.cached import cache_namespace
from bulksync.errors import sync_timeout_error
from bulksync.graph.schema import is_async_callable
from bulksync.types import RetryPolicy, TimeoutPolicy
from bulksync.warnings import LangGraphDeprecatedSinceV05

P = ParamSpec("P")
T = TypeVar("T")


class TaskFunction(Generic[P, T]):
    """A function decorated with ``@task``: calling it starts a call and returns its future."""

    def __init__(
        self,
        func: Callable[P, Any],
        *,
        name: str | None,
        retry_policy: Sequence[RetryPolicy],
        cache_policy: Any = None,
        timeout: TimeoutPolicy | None = None,
    ) -> None:
        self.func = func
        self.name = name or _name_of(func)
        self.retry_policy = tuple(retry_policy)
        self.cache_policy = cache_policy
        self.timeout = timeout
        if timeout is not None and not is_async_callable(func):
            raise sync_timeout_error(f"Task '{self.name}'")
        functools.update_wrapper(self, func)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Start the call; a future of its result.

        Raises:
            RuntimeError: outside a node or entrypoint that bulksync is running.
        """
        ctx = maybe_current_task()
        if ctx is None or ctx.calls is None:
            raise RuntimeError(
                f"Called @task '{self.name}' outside a running graph: a task can only be "
                "called from within an @entrypoint or a node of a StateGraph that bulksync runs."
            )
        return ctx.calls.submit(
            self.func,
            args,
            kwargs,
            name=self.name,
            retry_policy=self.retry_policy,
            timeout=self.timeout,
            cache_policy=self.cache_policy,
        )

    def clear_cache(self, cache: Any) -> None:
        """Forget this task's results cached in ``cache``."""
        cache.clear([cache_namespace(self.name, self.func)])

    async def aclear_cache(self, cache: Any) -> None:
        """``clear_cache`` for async callers."""
        self.clear_cache(cache)


def task(
    __func_or_none__: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retry_policy: RetryPolicy | Sequence[RetryPolicy] | None = None,
    cache_policy: Any = None,
    timeout: float | timedelta | TimeoutPolicy | None = None,
    **kwargs: Any,
) -> Any:
    """Make a function a task (``@task`` or ``@task(name=..., retry_policy=...)``).

    ``timeout`` times each attempt of an async task's calls (``TimeoutPolicy``).
    ``retry=`` is LangGraph's deprecated name of ``retry_policy`` (it warns, as there).

    Raises:
        ValueError: a timeout is not greater than 0, or is given for a sync function.
    """
    if "retry" in kwargs:
        warnings.warn(
            LangGraphDeprecatedSinceV05(
                "`retry` is deprecated and will be removed. Please use `retry_policy` instead."
            ),
            stacklevel=2,
        )
        retry_policy = retry_policy if retry_policy is not None else kwargs.pop("retry")
    if kwargs:
        raise TypeError(f"task() got unexpected keyword arguments: {', '.join(kwargs)}")
    policies: Sequence[RetryPolicy] = (
        ()
        if retry_policy is None
        else (retry_policy,)
        if isinstance(retry_policy, RetryPolicy)
        else retry_policy
    )
    policy = TimeoutPolicy.coerce(timeout)

    def decorate(func: Callable[..., Any]) -> TaskFunction[Any, Any]:
        return TaskFunction(
            func, name=name, retry_policy=policies, cache_policy=cache_policy, timeout=policy
        )

    return decorate(__func_or_none__) if __func_or_none__ is not None else decorate


def _name_of(func: Any) -> str:
    name = getattr(func, "__name__", None)
    if isinstance(name, str):
        return name
    inner = getattr(func, "func", None)  # a functools.partial
    return _name_of(inner) if inner is not None else type(func).__name__
