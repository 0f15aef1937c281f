"""The values users put into graphs and get out of them (LangGraph's ``langgraph.types``)."""

from __future__ import annotations

import dataclasses
import random
import warnings
from collections.abc import Callable, Hashable, Sequence
from datetime import timedelta
from typing import Any, ClassVar, Generic, Literal, NamedTuple, TypeVar

from bulksync.context import current_task
from bulksync.errors import ConfigError, GraphInterrupt, mark_invalid_resume
from bulksync.ids import interrupt_id
from bulksync.warnings import LangGraphDeprecatedSinceV11

N = TypeVar("N", bound=Hashable)
OutputT = TypeVar("OutputT")

StreamMode = Literal[
    "values",
    "updates",
    "custom",
    "debug",
    "tasks",
    "checkpoints",
    "messages",
    "tools",
    "progress",
]
"""How ``stream`` frames its output (DESIGN.md §2): the one list of modes.

Declared here, the lowest layer that needs it (LangGraph exports it from ``types``);
``coordinator.stream.ALL_MODES`` is its runtime tuple, used by parsing and the CLI.
``progress`` is bulksync's own: while a step runs on a cluster, where its tasks are
(queued, running and on which workers, done) and which queues nobody takes from.
"""

Durability = Literal["sync", "async", "exit"]
"""When checkpoints are written: before the next step (sync), overlapping it, or at exit."""

All = Literal["*"]


@dataclasses.dataclass(frozen=True, slots=True)
class CachePolicy:
    """Cache a node's (or ``@task``'s) results by input (LangGraph's): with a cache given to
    ``compile(cache=...)``, a task whose ``key_func(input)`` matches an earlier one's is not
    run again, its writes reused (streamed with ``{"cached": True}`` metadata) for ``ttl``
    seconds (None: until the cache is cleared). Without a ``key_func`` the key is the input's
    own bytes in bulksync's msgpack serde (``coordinator/cached.py``)."""

    key_func: Callable[..., str | bytes] | None = None
    ttl: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TimeoutPolicy:
    """How long one attempt of an async node or ``@task`` call may take (LangGraph's).

    ``run_timeout``: seconds from the attempt's start, never extended. ``idle_timeout``:
    seconds without progress — ``runtime.heartbeat()``, and under ``refresh_on="auto"`` also
    a stream write, a ``@task`` call started or a LangChain callback event of what the node
    calls (a chat model's tokens). Past either, the attempt is cancelled and fails with
    ``NodeTimeoutError`` (``workers/timeouts.py``). A plain number or ``timedelta`` given
    where a policy is expected is a ``run_timeout``.
    """

    run_timeout: float | timedelta | None = None
    idle_timeout: float | timedelta | None = None
    refresh_on: Literal["auto", "heartbeat"] = "auto"

    @classmethod
    def coerce(cls, value: float | timedelta | TimeoutPolicy | None) -> TimeoutPolicy | None:
        """``value`` as a policy in seconds (None for no timeout).

        Raises:
            ValueError: a timeout is not greater than 0, or ``refresh_on`` is unknown.
        """
        if value is None:
            return None
        policy = value if isinstance(value, TimeoutPolicy) else cls(run_timeout=value)
        if policy.refresh_on not in ("auto", "heartbeat"):
            raise ValueError(
                f"TimeoutPolicy(refresh_on={policy.refresh_on!r}): use 'auto' or 'heartbeat'."
            )
        run = _seconds(policy.run_timeout, "run_timeout")
        idle = _seconds(policy.idle_timeout, "idle_timeout")
        if run is None and idle is None:
            return None
        if (run, idle) == (policy.run_timeout, policy.idle_timeout):
            return policy  # already in seconds: the same (immutable) object
        return cls(run_timeout=run, idle_timeout=idle, refresh_on=policy.refresh_on)


def _seconds(value: float | timedelta | None, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise ValueError(f"{field} must be a number of seconds or a timedelta, got {value!r}.")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise ValueError(f"{field} must be greater than 0 seconds, got {value!r}.")
    return seconds


class Send:
    """A message to run ``node`` once with ``arg`` as its input, in the next step (a PUSH task).

    ``timeout`` (a ``TimeoutPolicy``, or seconds) replaces the node's own for this task.
    """

    __slots__ = ("node", "arg", "timeout")

    def __init__(
        self, node: str, arg: Any, *, timeout: float | timedelta | TimeoutPolicy | None = None
    ) -> None:
        self.node = node
        self.arg = arg
        self.timeout = TimeoutPolicy.coerce(timeout)

    def __hash__(self) -> int:
        return hash((self.node, repr(self.arg), self.timeout))

    def __repr__(self) -> str:
        if self.timeout is None:
            return f"Send(node={self.node!r}, arg={self.arg!r})"
        return f"Send(node={self.node!r}, arg={self.arg!r}, timeout={self.timeout!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Send) and (self.node, self.arg, self.timeout) == (
            other.node,
            other.arg,
            other.timeout,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Interrupt:
    """A pause raised by ``interrupt(value)``; resume it with ``Command(resume=…)``."""

    value: Any
    id: str = ""
    response_schema: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Overwrite:
    """Replace a reducer key's value outright instead of reducing into it."""

    value: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Command(Generic[N]):
    """Update state and choose the next nodes from a node, or resume a run as its input."""

    graph: str | None = None
    update: Any | None = None
    resume: dict[str, Any] | Any | None = None
    goto: Send | Sequence[Send | N] | N = ()

    PARENT: ClassVar[Literal["__parent__"]] = "__parent__"

    def __repr__(self) -> str:
        """The fields that are set, as LangGraph shows a Command (``Command(goto='x')``)."""
        fields = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return "Command(" + ", ".join(f"{k}={v!r}" for k, v in fields if v) + ")"

    def update_items(self) -> list[tuple[str, Any]]:
        """The update as ``(key, value)`` pairs, in the order given."""
        return update_as_tuples(self.update)


def update_as_tuples(update: Any) -> list[tuple[str, Any]]:
    """Turn a ``Command.update`` (dict, pairs, dataclass or model) into key/value pairs."""
    if update is None:
        return []
    if isinstance(update, dict):
        return list(update.items())
    if isinstance(update, (list, tuple)) and all(
        isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str) for t in update
    ):
        return list(update)
    if dataclasses.is_dataclass(update) and not isinstance(update, type):
        return [(f.name, getattr(update, f.name)) for f in dataclasses.fields(update)]
    fields = getattr(type(update), "model_fields", None)
    if fields is not None:
        # As LangGraph: a field left at a None default and never set is no update.
        given = getattr(update, "model_fields_set", ())
        return [
            (k, value)
            for k, field in fields.items()
            if (value := getattr(update, k)) is not None
            or getattr(field, "default", None) is not None
            or k in given
        ]
    return [("__root__", update)]


def default_retry_on(exc: Exception) -> bool:
    """LangGraph's default: retry unknown and connection errors, not programming errors."""
    if isinstance(exc, ConnectionError):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    name = type(exc).__name__
    if name in ("HTTPStatusError", "HTTPError") and type(exc).__module__.split(".")[0] in (
        "httpx",
        "requests",
    ):
        return status is None or status >= 500
    return not isinstance(
        exc,
        (
            ValueError,
            TypeError,
            ArithmeticError,
            ImportError,
            LookupError,
            NameError,
            SyntaxError,
            RuntimeError,
            ReferenceError,
            StopIteration,
            StopAsyncIteration,
            OSError,
        ),
    )


class RetryPolicy(NamedTuple):
    """How a failing node is retried; LangGraph's defaults."""

    initial_interval: float = 0.5
    backoff_factor: float = 2.0
    max_interval: float = 128.0
    max_attempts: int = 3
    jitter: bool = True
    retry_on: type[Exception] | Sequence[type[Exception]] | Callable[[Exception], bool] = (
        default_retry_on
    )

    def should_retry(self, exc: Exception) -> bool:
        """Whether this policy covers ``exc``."""
        on = self.retry_on
        if isinstance(on, type):
            return isinstance(exc, on)
        if isinstance(on, Sequence):
            return isinstance(exc, tuple(on))
        return bool(on(exc))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        base = min(self.max_interval, self.initial_interval * self.backoff_factor ** (attempt - 1))
        return base + (random.uniform(0, 1) if self.jitter else 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class PregelTask:
    """A task as shown by ``get_state``: what runs next, and what it left behind."""

    id: str
    name: str
    path: tuple[Any, ...]
    error: Exception | str | None = None
    interrupts: tuple[Interrupt, ...] = ()
    state: Any = None
    result: Any | None = None


class StateSnapshot(NamedTuple):
    """A thread's state at one checkpoint, as ``get_state`` returns it."""

    values: dict[str, Any] | Any
    next: tuple[str, ...]
    config: dict[str, Any]
    metadata: dict[str, Any] | None
    created_at: str | None
    parent_config: dict[str, Any] | None
    tasks: tuple[PregelTask, ...]
    interrupts: tuple[Interrupt, ...] = ()


def interrupt(value: Any, *, response_schema: Any = None) -> Any:
    """Pause the running node until a ``Command(resume=…)`` answers ``value``.

    The node runs again from its start on resume; the n-th call to ``interrupt`` in it
    returns the n-th answer. ``response_schema`` says what answer is expected: a JSON schema
    (a dict) is only shown with the interrupt; a type (a pydantic model, TypedDict,
    dataclass, …) is shown as its JSON schema and the answer is validated against it and
    returned as that type (pydantic needed).

    Raises:
        GraphInterrupt: when no answer is available yet (caught by the engine).
        RuntimeError: when called outside a running node.
        pydantic.ValidationError: an answer that does not match ``response_schema``.
    """
    ctx = current_task()
    pad = ctx.scratchpad
    adapter = _response_adapter(response_schema)
    idx = pad.next_interrupt_index()
    if idx < len(pad.resume):
        checked = _checked(adapter, pad.resume[idx])
        ctx.record_resume(pad.resume[: idx + 1])
        return checked
    answer = pad.take_null_resume()
    if answer is not None:
        checked = _checked(adapter, answer)
        pad.resume.append(answer)
        ctx.record_resume(list(pad.resume))
        return checked
    shown = adapter.json_schema() if adapter is not None else response_schema
    ask = Interrupt(
        value=value, id=interrupt_id(pad.task_ns, len(pad.resume)), response_schema=shown
    )
    raise GraphInterrupt((ask,))


def _checked(adapter: Any, answer: Any) -> Any:
    """``answer`` validated by ``adapter`` (if any); an invalid one raises a marked error
    before it is recorded as taken, so the interrupt stays open."""
    if adapter is None:
        return answer
    try:
        return adapter.validate_python(answer)
    except Exception as exc:
        raise mark_invalid_resume(exc) from None


def _response_adapter(schema: Any) -> Any:
    """A pydantic ``TypeAdapter`` for a ``response_schema`` type; None for none or a dict."""
    if schema is None or isinstance(schema, dict):
        return None
    try:
        from pydantic import TypeAdapter
    except ImportError as exc:  # pydantic is not a dependency of bulksync's core
        raise ConfigError(
            f"interrupt(response_schema={schema!r}) validates answers with pydantic: install "
            "pydantic, or pass the JSON schema as a dict."
        ) from exc
    return TypeAdapter(schema)


_OUTPUT_ACCESS = (
    "Accessing GraphOutput via `{how}` is deprecated: read result.value for the output and "
    "result.interrupts for the interrupts"
)


@dataclasses.dataclass(frozen=True, slots=True)
class GraphOutput(Generic[OutputT]):
    """What ``invoke(..., version="v2")`` returns: the output ``value`` (an instance of the
    output schema for dataclass and pydantic states) and the run's ``interrupts``.

    Reading it like the v1 dict (``result["key"]``, ``"__interrupt__" in result``) still
    works, with a ``DeprecationWarning``, as in LangGraph.
    """

    value: OutputT
    interrupts: tuple[Interrupt, ...] = ()

    def __getitem__(self, key: str) -> Any:
        """The v1 reading: ``"__interrupt__"`` gives the interrupts, any other key a value."""
        warnings.warn(
            LangGraphDeprecatedSinceV11(_OUTPUT_ACCESS.format(how="result[key]")), stacklevel=2
        )
        if key == "__interrupt__":
            return self.interrupts
        if isinstance(self.value, dict):
            return self.value[key]
        try:
            return getattr(self.value, key)
        except AttributeError:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        """The v1 test: ``"__interrupt__"`` when there are interrupts, else a value's key."""
        warnings.warn(
            LangGraphDeprecatedSinceV11(_OUTPUT_ACCESS.format(how="key in result")), stacklevel=2
        )
        if key == "__interrupt__":
            return bool(self.interrupts)
        if isinstance(self.value, dict):
            return key in self.value
        return isinstance(key, str) and hasattr(self.value, key)
