"""What a state schema or a node's callable declares: channels, input coercion, injected arguments.

A schema is a TypedDict, a dataclass or a pydantic v2 model (pydantic is never imported here: a
model can only exist if its user already imported pydantic). Each annotated key becomes a
channel, as in LangGraph: ``Annotated[T, reducer]`` a ``BinaryOperatorAggregate``,
``Annotated[T, SomeChannel(...)]`` that channel, anything else a ``LastValue``. A type without
annotations (``StateGraph(Annotated[list, add])``) is a single-value state kept under
``__root__``.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, NotRequired, Required, Union, is_typeddict

from bulksync.channels.base import BaseChannel
from bulksync.channels.binop import BinaryOperatorAggregate
from bulksync.channels.last_value import LastValue
from bulksync.config import get_config, get_stream_writer
from bulksync.constants import RESERVED
from bulksync.context import maybe_current_task
from bulksync.errors import InvalidGraphError
from bulksync.managed import managed_kind
from bulksync.runtime import Runtime, get_runtime
from bulksync.types import Command

ROOT = "__root__"
"""The one channel of a state schema that has no keys."""

_INJECTABLE = ("config", "writer", "runtime", "store", "previous")
_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def is_pydantic_model(schema: Any) -> bool:
    """Whether ``schema`` is a pydantic v2 model class (False when pydantic was never imported)."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(schema, type):
        return False
    return issubclass(schema, pydantic.BaseModel)


def is_coerced_schema(schema: Any) -> bool:
    """Whether a node reading ``schema`` gets an instance of it rather than a dict."""
    return isinstance(schema, type) and (
        dataclasses.is_dataclass(schema) or is_pydantic_model(schema)
    )


def schema_channels(schema: Any) -> dict[str, BaseChannel[Any, Any]]:
    """One channel per key of ``schema``, in declaration order.

    Raises:
        InvalidGraphError: a key is a name bulksync reserves, or a reducer does not take two
            arguments.
    """
    if not hasattr(schema, "__annotations__"):
        return {ROOT: channel_for(ROOT, schema)}
    channels: dict[str, BaseChannel[Any, Any]] = {}
    for name, annotation in typing.get_type_hints(schema, include_extras=True).items():
        if name == "__slots__" or typing.get_origin(annotation) is ClassVar:
            continue
        if managed_kind(annotation) is not None:
            continue  # a managed value: the engine fills it in, no channel holds it
        if name in RESERVED:
            raise InvalidGraphError(
                f"State key '{name}' of {getattr(schema, '__name__', schema)!r} is reserved by "
                "bulksync; rename the key."
            )
        channels[name] = channel_for(name, annotation)
    return channels


def schema_managed(schema: Any) -> dict[str, str]:
    """The managed keys of ``schema`` (``RemainingSteps``, ``IsLastStep``) and their kinds."""
    if not hasattr(schema, "__annotations__"):
        return {}
    hints = typing.get_type_hints(schema, include_extras=True)
    return {k: kind for k, hint in hints.items() if (kind := managed_kind(hint)) is not None}


def channel_for(name: str, annotation: Any) -> BaseChannel[Any, Any]:
    """The channel that holds key ``name`` declared as ``annotation``."""
    if typing.get_origin(annotation) in (Required, NotRequired):
        annotation = typing.get_args(annotation)[0]
    channel: BaseChannel[Any, Any]
    metadata = getattr(annotation, "__metadata__", ())
    declared = _declared_channel(annotation, metadata)
    if declared is not None:
        channel = declared
    elif metadata and callable(metadata[-1]):
        channel = BinaryOperatorAggregate(annotation, _checked_reducer(name, metadata[-1]))
    else:
        channel = LastValue(annotation)
    channel.key = name
    return channel


def _declared_channel(annotation: Any, metadata: tuple[Any, ...]) -> BaseChannel[Any, Any] | None:
    """A channel given in ``Annotated[T, ...]``: an instance as is, a class built for ``T``."""
    for item in metadata:
        if isinstance(item, BaseChannel):
            return item
        if isinstance(item, type) and issubclass(item, BaseChannel):
            built: BaseChannel[Any, Any] = item(getattr(annotation, "__origin__", annotation))
            return built
    return None


def _checked_reducer(name: str, reducer: Callable[..., Any]) -> Callable[..., Any]:
    """``reducer`` if it takes exactly two positional arguments, as ``(current, update)``."""
    sig = inspect.signature(reducer)
    positional = sum(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in sig.parameters.values()
    )
    if positional != 2:
        raise InvalidGraphError(
            f"Invalid reducer signature for state key '{name}'. Expected (a, b) -> c. Got {sig}"
        )
    return reducer


def stored_types(schemas: Iterable[Any]) -> set[type]:
    """The dataclasses, pydantic models, Enums and NamedTuples the values of ``schemas`` can
    hold, found through their keys' annotations (``list[Box]``, ``Optional[Point]``, …) and
    those classes' own fields, to any depth.

    Compiling registers them with the serde: a class defined inside a function cannot be
    found by its name when a stored value is decoded, but it is reachable from the schema.
    """
    found: set[type] = set()
    pending: list[Any] = list(schemas)
    while pending:
        item = pending.pop()
        args = typing.get_args(item)
        if args:  # list[X], X | None, Annotated[X, reducer], dict[K, V], Literal[...] …
            pending.extend(a for a in args if not isinstance(a, str))
            continue
        if not isinstance(item, type) or item in found:
            continue
        kind = is_coerced_schema(item) or issubclass(item, enum.Enum) or _is_named_tuple(item)
        if kind:
            found.add(item)
        if kind or is_typeddict(item):
            pending.extend(_field_types(item))
    return found


def _is_named_tuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _field_types(cls: type) -> list[Any]:
    """The annotations of ``cls``'s fields (pydantic's resolved ones; else what resolves)."""
    if is_pydantic_model(cls):
        return [f.annotation for f in typing.cast(Any, cls).model_fields.values()]
    try:
        return list(typing.get_type_hints(cls, include_extras=True).values())
    except (NameError, TypeError):  # a name only the defining function could resolve
        return []


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaCoercer:
    """Builds an instance of a dataclass or pydantic schema from a node's input dict."""

    schema: type[Any]

    def __call__(self, values: dict[str, Any]) -> Any:
        """``schema(**values)``."""
        return self.schema(**values)


def schema_mapper(schema: Any) -> SchemaCoercer | None:
    """The input coercion for nodes reading ``schema``; None for TypedDict and root schemas."""
    return SchemaCoercer(schema) if is_coerced_schema(schema) else None


@dataclasses.dataclass(frozen=True, slots=True)
class InjectingCall:
    """Calls a user's function with one input plus the ``config``/``writer`` it declares."""

    func: Callable[..., Any]
    config: bool = False
    writer: bool = False
    runtime: bool = False
    store: bool = False
    previous: bool = False
    error: bool = False

    def __call__(self, value: Any) -> Any:
        """``func(value, config=…, writer=…, runtime=…, store=…, previous=…)``, from the
        running task (``previous``: what the last run on the thread saved, for entrypoints)."""
        kwargs: dict[str, Any] = {}
        if self.config:
            kwargs["config"] = get_config()
        if self.writer:
            kwargs["writer"] = get_stream_writer()
        if self.runtime or self.store or self.previous:
            runtime: Runtime[Any] = get_runtime()
            if self.runtime:
                kwargs["runtime"] = runtime
            if self.store:
                kwargs["store"] = runtime.store
            if self.previous:
                kwargs["previous"] = runtime.previous
        if self.error:  # an error handler's ``error: NodeError``
            ctx = maybe_current_task()
            kwargs["error"] = ctx.node_error if ctx is not None else None
        return self.func(value, **kwargs)


def injecting_call(func: Callable[..., Any]) -> InjectingCall:
    """Wrap ``func``, inspecting its signature once for ``config`` and ``writer`` parameters."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins without a signature take just the input
        return InjectingCall(func)
    wanted = {name: name in params and params[name].kind in _KEYWORD_KINDS for name in _INJECTABLE}
    error = params.get("error")
    # As LangGraph: ``error`` is injected when annotated ``NodeError`` (None outside handlers).
    wanted["error"] = (
        error is not None and error.kind in _KEYWORD_KINDS and "NodeError" in str(error.annotation)
    )
    return InjectingCall(func, **wanted)


def is_async_callable(func: Any) -> bool:
    """Whether calling ``func`` returns a coroutine (an async function or async ``__call__``)."""
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004  # the method itself is inspected
    return inspect.ismethod(call) and inspect.iscoroutinefunction(call)


def _annotated_callable(func: Any) -> Any:
    """The function whose annotations describe ``func`` (its ``__call__`` for objects)."""
    if inspect.isfunction(func) or inspect.ismethod(func):
        return func
    call = getattr(func, "__call__", None)  # noqa: B004
    return call if inspect.ismethod(call) else None


def _type_hints(func: Any) -> dict[str, Any]:
    target = _annotated_callable(func)
    if target is None:
        return {}
    try:
        return typing.get_type_hints(target)
    except (NameError, TypeError):  # unresolvable annotations declare nothing, like LangGraph
        return {}


def declared_input_schema(func: Any) -> type[Any] | None:
    """The class annotating ``func``'s first parameter when it has typed keys (a schema)."""
    hints = _type_hints(func)
    try:
        first = next(iter(inspect.signature(func).parameters))
    except (StopIteration, TypeError, ValueError):
        return None
    hint = hints.get(first)
    if isinstance(hint, type) and _has_type_hints(hint):
        return hint
    return None


def _has_type_hints(cls: type[Any]) -> bool:
    try:
        return bool(typing.get_type_hints(cls))
    except (NameError, TypeError):
        return False


def declared_return(func: Any) -> Any:
    """``func``'s return annotation (``NoneType`` for ``-> None``), or None when it has none."""
    return _type_hints(func).get("return")


def command_destinations(annotation: Any) -> tuple[str, ...] | None:
    """The node names in ``-> Command[Literal["a", "b"]]`` (also inside a union); else None."""
    for option in _union_options(annotation):
        if typing.get_origin(option) is Command:
            args = typing.get_args(option)
            if args and typing.get_origin(args[0]) is Literal:
                return tuple(str(v) for v in typing.get_args(args[0]))
    return None


def may_return_command(annotation: Any) -> bool:
    """Whether a callable annotated ``-> annotation`` may return a ``Command``.

    True for ``Command`` (bare, parametrized or in a union), for ``Any``/``object``, and for
    no annotation at all (``None``); False for anything else (``-> dict``, ``-> None``...).
    """
    if annotation is None:
        return True
    return any(
        option is Command
        or option is Any
        or option is object
        or typing.get_origin(option) is Command
        for option in _union_options(annotation)
    )


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` annotation, or None for any other annotation."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return None


def _union_options(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)
