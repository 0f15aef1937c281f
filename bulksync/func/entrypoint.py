"""``@entrypoint``: a function as a one-node graph, with ``@task`` calls as its tasks.

The graph has three channels, as in LangGraph: ``__start__`` receives the input (read by
the one node, named after the function), ``__end__`` holds what it returned (the run's
output, and the state ``get_state`` shows), ``__previous__`` what it saved for the next run
on the thread (``entrypoint.final(value=..., save=...)`` returns one value and saves
another). The function may declare ``previous``, ``config``, ``runtime``, ``store`` and
``writer`` parameters; they are injected. Like any compiled graph it runs in-process or on
the cluster, checkpoints, pauses on ``interrupt`` and resumes with ``Command(resume=...)``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Generic, TypeVar, get_args, get_origin

from bulksync.channels.ephemeral_value import EphemeralValue
from bulksync.channels.last_value import LastValue
from bulksync.constants import END, PREVIOUS, START
from bulksync.coordinator.cached import cache_namespace
from bulksync.coordinator.spec import GraphSpec, NodeSpec, ReadState, Write
from bulksync.errors import sync_timeout_error
from bulksync.graph.compiled import CompiledStateGraph
from bulksync.graph.drawing import DrawableGraph, DrawEdge
from bulksync.graph.langchain_graph import langchain_available, to_langchain_graph
from bulksync.graph.schema import injecting_call, is_async_callable
from bulksync.graph.state import check_checkpointer
from bulksync.types import RetryPolicy, TimeoutPolicy
from bulksync.warnings import LangGraphDeprecatedSinceV05, LangGraphDeprecatedSinceV10

R = TypeVar("R")
S = TypeVar("S")


class entrypoint:
    """Decorator making a function a graph: ``@entrypoint(checkpointer=...)``."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class final(Generic[R, S]):
        """Returned by an entrypoint: ``value`` is the run's output, ``save`` what the next
        run on the thread gets as ``previous``."""

        value: R
        save: S

    def __init__(
        self,
        checkpointer: Any = None,
        store: Any = None,
        cache: Any = None,
        context_schema: Any = None,
        cache_policy: Any = None,
        retry_policy: RetryPolicy | Sequence[RetryPolicy] | None = None,
        timeout: float | timedelta | TimeoutPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        """``timeout`` times each attempt of an async entrypoint (``TimeoutPolicy``).

        Raises:
            ValueError: a timeout is not greater than 0.
        """
        if "config_schema" in kwargs:
            _deprecated(LangGraphDeprecatedSinceV10, "config_schema", "context_schema")
            context_schema = context_schema or kwargs.pop("config_schema")
        if "retry" in kwargs:
            _deprecated(LangGraphDeprecatedSinceV05, "retry", "retry_policy")
            retry_policy = retry_policy or kwargs.pop("retry")
        if kwargs:
            raise TypeError(f"entrypoint() got unexpected keyword arguments: {', '.join(kwargs)}")
        check_checkpointer(checkpointer)
        self.checkpointer = checkpointer
        self.store = store
        self.cache = cache
        self.context_schema = context_schema
        self.cache_policy = cache_policy
        self.timeout = TimeoutPolicy.coerce(timeout)
        self.retry_policy: tuple[RetryPolicy, ...] = (
            ()
            if retry_policy is None
            else (retry_policy,)
            if isinstance(retry_policy, RetryPolicy)
            else tuple(retry_policy)
        )

    def __call__(self, func: Callable[..., Any]) -> EntrypointGraph:
        """The graph running ``func``.

        Raises:
            NotImplementedError: for a generator function (LangGraph's error).
            ValueError: for a function without parameters (it takes the input), or a
                timeout on a sync function (it could not be stopped).
            TypeError: for a return annotation ``entrypoint.final[X]`` missing the save type.
        """
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise NotImplementedError("Generators are not supported in the Functional API.")
        signature = _signature(func)
        if not signature.parameters:
            raise ValueError("Entrypoint function must have at least one parameter")
        first = next(iter(signature.parameters.values()))
        input_type = first.annotation
        if input_type is inspect.Signature.empty or isinstance(input_type, str):
            input_type = Any
        output_type, save_type = _final_types(signature.return_annotation)
        name = getattr(func, "__name__", type(func).__name__)
        if self.timeout is not None and not is_async_callable(func):
            raise sync_timeout_error(f"Entrypoint '{name}'")
        builder = EntrypointBuilder(
            func, name, input_type, output_type, save_type, self.context_schema
        )
        node = NodeSpec(
            name=name,
            triggers=(START,),
            channels=START,
            run=injecting_call(func),
            writer=_write_final,
            retry_policy=self.retry_policy,
            timeout=self.timeout,
            cache_policy=self.cache_policy,
            cache_ns=cache_namespace(name, func),
            is_async=is_async_callable(func),
        )
        spec = GraphSpec(
            name="LangGraph",
            nodes={name: node},
            channels={
                START: EphemeralValue(input_type),
                END: LastValue(output_type, END),
                PREVIOUS: LastValue(save_type, PREVIOUS),
            },
            input_channels=START,
            output_channels=END,
            stream_channels=END,
            trigger_to_nodes={START: (name,)},
            store=self.store,
            cache=self.cache,
        )
        return EntrypointGraph(builder=builder, spec=spec, checkpointer=self.checkpointer)


@dataclasses.dataclass(frozen=True, slots=True)
class _Node:
    """An entrypoint's one node, as the compiled graph's builder lists it."""

    action: Callable[..., Any]
    subgraph: Any = None


@dataclasses.dataclass(frozen=True)
class EntrypointBuilder:
    """What an entrypoint's compiled graph reads of its builder (schemas, its one node)."""

    func: Callable[..., Any]
    name: str
    input_schema: Any
    output_schema: Any
    save_schema: Any
    context_schema: Any

    @property
    def nodes(self) -> Mapping[str, _Node]:
        """The function, as the graph's only node."""
        return {self.name: _Node(self.func)}

    @property
    def state_schema(self) -> Any:
        """None: the state is one value, not a schema's keys."""
        return None

    @property
    def schemas(self) -> Mapping[Any, tuple[str, ...]]:
        """No keyed schema: values stream as they are."""
        return {None: ()}


class EntrypointGraph(CompiledStateGraph):
    """A compiled ``@entrypoint``: LangGraph's graph API over the one-node graph."""

    builder: EntrypointBuilder

    def get_graph(
        self, config: Mapping[str, Any] | None = None, *, xray: bool | int = False
    ) -> Any:
        """``__start__ → <function> → __end__``, drawn as LangGraph draws an entrypoint."""
        name = self.builder.name
        drawing = DrawableGraph([START, name, END], [DrawEdge(START, name), DrawEdge(name, END)])
        if not langchain_available():
            return drawing
        return to_langchain_graph(drawing, {name: self.builder.func})


def _write_final(output: Any, read: ReadState) -> list[Write]:
    """The node's writes: the output to ``__end__``, what it saves to ``__previous__``."""
    if isinstance(output, entrypoint.final):
        return [(END, output.value), (PREVIOUS, output.save)]
    return [(END, output), (PREVIOUS, output)]


def _signature(func: Callable[..., Any]) -> inspect.Signature:
    """``func``'s signature, its string annotations resolved where they can be (a name only
    the defining function's scope knows stays a string, read as ``Any``)."""
    try:
        return inspect.signature(func, eval_str=True)
    except NameError:
        return inspect.signature(func)


def _final_types(annotation: Any) -> tuple[Any, Any]:
    """The output and saved types a return annotation gives (``Any`` when absent)."""
    if annotation is inspect.Signature.empty or annotation is entrypoint.final:
        return Any, Any
    if isinstance(annotation, str):  # unresolved
        return Any, Any
    if get_origin(annotation) is entrypoint.final:
        args = get_args(annotation)
        if len(args) != 2:
            raise TypeError(
                "Please an annotation for both the return_ and the save values. For example, "
                "`-> entrypoint.final[int, str]` would assign a return_ a type of `int` and "
                "save the type `str`."
            )
        return args[0], args[1]
    return annotation, annotation


def _deprecated(category: type[Warning], old: str, new: str) -> None:
    import warnings

    message = f"`{old}` is deprecated and will be removed. Please use `{new}` instead."
    warnings.warn(category(message), stacklevel=3)
