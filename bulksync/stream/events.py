"""``stream_events`` / ``astream_events``: a run as a v3 event stream, over ``stream``.

``version="v3"`` builds a mux from the built-in transformers (values, messages, lifecycle,
subgraphs), the graph's compile-time ``transformers`` and the call's ``transformers``, asks
the graph's own ``stream(..., version="v2", subgraphs=True)`` for exactly the modes those
transformers need, and hands back a run stream its reader drives. Every other keyword goes
to ``stream`` unchanged (``context``, ``durability``, ``interrupt_before``, ``control``…);
``stream_mode`` and ``subgraphs`` are v3's own. ``version="v1"``/``"v2"`` (LangChain's
callback events) are in ``stream.callback_events``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bulksync.constants import CHECKPOINT_NS, MESSAGE_EVENTS, NS_SEP
from bulksync.stream.messages import MessagesTransformer
from bulksync.stream.mux import StreamMux, StreamTransformer, TransformerFactory
from bulksync.stream.run import AsyncGraphRunStream, GraphRunStream
from bulksync.stream.transformers import (
    LifecycleTransformer,
    SubgraphTransformer,
    ValuesTransformer,
)

BUILTINS: tuple[TransformerFactory, ...] = (
    ValuesTransformer,
    MessagesTransformer,
    LifecycleTransformer,
    SubgraphTransformer,
)
"""The transformers of every v3 run, ahead of the graph's and the call's."""

V3_OWNS = ("stream_mode", "subgraphs")
"""``stream`` keywords a v3 call may not pass: v3 chooses them."""


def transformer_factories(specs: Sequence[Any] | None, where: str) -> list[TransformerFactory]:
    """``specs`` checked: each a callable taking a scope (a transformer class is one).

    Raises:
        TypeError: a transformer instance (it cannot be rebuilt for a subgraph's scope) or
            something not callable, named with ``where`` it was given.
    """
    factories: list[TransformerFactory] = []
    for spec in specs or ():
        if isinstance(spec, StreamTransformer):
            raise TypeError(
                f"{where} transformers must be scope-aware callables, got pre-built instance "
                f"{type(spec).__name__}. Pass the transformer class or a factory like "
                "`lambda scope: MyTransformer(scope, ...)`."
            )
        if not callable(spec):
            raise TypeError(
                f"{where} transformers must be scope-aware callables, got {type(spec).__name__}."
            )
        factories.append(spec)
    return factories


def drop_inherited_message_events(configurable: dict[str, Any]) -> None:
    """A run started inside a node of a v3 run inherits its config, flag included: unless
    the flag was set for this very call (it names the caller's namespace), the run streams
    ``messages`` as it was asked to — v1 token chunks."""
    flag = configurable.get(MESSAGE_EVENTS)
    if flag is not None and flag != (configurable.get(CHECKPOINT_NS) or ""):
        del configurable[MESSAGE_EVENTS]


def _run_scope(config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The namespace the caller runs under: ``()`` at the root, a node's task namespace
    when a node streams a graph with its own config."""
    ns = ((config or {}).get("configurable") or {}).get(CHECKPOINT_NS)
    return tuple(ns.split(NS_SEP)) if ns else ()


class EventStreamMethods:
    """Mixin: ``stream_events`` and ``astream_events`` over the class's ``stream``."""

    stream_transformers: Sequence[TransformerFactory] = ()
    """Transformers given at compile time (``compile(transformers=…)``)."""

    if TYPE_CHECKING:

        def stream(
            self, input: Any, config: Mapping[str, Any] | None = ..., **kw: Any
        ) -> Iterator[Any]: ...

        def astream(
            self, input: Any, config: Mapping[str, Any] | None = ..., **kw: Any
        ) -> AsyncIterator[Any]: ...

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        """The graph's name in LangChain's events (``name`` and ``suffix`` as a Runnable's)."""
        base = name or getattr(self, "name", None) or type(self).__name__
        if not suffix:
            return base
        return base + suffix.title() if base[0].isupper() else f"{base}_{suffix.lower()}"

    def _event_mux(
        self,
        config: Mapping[str, Any] | None,
        transformers: Sequence[Any] | None,
        kwargs: dict[str, Any],
        *,
        is_async: bool,
    ) -> tuple[StreamMux, dict[str, Any], dict[str, Any]]:
        """The run's mux, the config to run with and the ``stream`` keywords."""
        owned = [k for k in V3_OWNS if k in kwargs]
        if owned:
            raise TypeError(
                f"stream_events(version='v3') / astream_events(version='v3') do not accept "
                f"{', '.join(owned)}; v3 owns these (stream_mode is built from the "
                "transformers, subgraphs is always True so subgraph events reach their "
                "handles)."
            )
        factories = [
            *BUILTINS,
            *transformer_factories(self.stream_transformers, "compile()"),
            *transformer_factories(transformers, "stream_events(version='v3')"),
        ]
        mux = StreamMux(factories=factories, scope=_run_scope(config), is_async=is_async)
        run_config = dict(config or {})
        run_config["configurable"] = {**(run_config.get("configurable") or {})}
        # The caller's namespace, so a graph a node runs with this config knows the flag
        # is not its own (``drop_inherited_message_events``).
        run_config["configurable"][MESSAGE_EVENTS] = NS_SEP.join(mux.scope)
        options = {
            # v3 passes these on even when not given (as LangGraph's v3 does).
            "interrupt_before": None,
            "interrupt_after": None,
            "control": None,
            **kwargs,
            "stream_mode": mux.required_stream_modes(),
            "subgraphs": True,
            "version": "v2",
        }
        return mux, run_config, options

    def stream_events(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        version: str = "v2",
        transformers: Sequence[Callable[[tuple[str, ...]], Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``version="v3"``: a ``GraphRunStream`` the caller reads to drive the run.

        LangChain's ``v1``/``v2`` events exist only as ``astream_events`` (as in LangChain).

        Raises:
            TypeError: ``stream_mode`` or ``subgraphs`` given with v3; a transformer that is
                not a scope-aware callable.
            NotImplementedError: ``version`` other than ``"v3"``.
        """
        if version != "v3":
            raise NotImplementedError(
                f"stream_events(version={version!r}) is not available synchronously; use "
                f"astream_events(version={version!r}), or stream_events(version='v3')."
            )
        mux, run_config, options = self._event_mux(config, transformers, kwargs, is_async=False)
        return GraphRunStream(iter(self.stream(input, run_config, **options)), mux)

    def astream_events(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        version: str = "v2",
        transformers: Sequence[Callable[[tuple[str, ...]], Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``version="v3"``: an awaitable of an ``AsyncGraphRunStream``; ``"v1"``/``"v2"``:
        LangChain's callback events (``on_chain_start``, ``on_chain_stream``, …) as an
        async iterator.

        Raises:
            TypeError: as ``stream_events``.
        """
        if version != "v3":
            from bulksync.stream.callback_events import callback_events

            return callback_events(self, input, config, version=version, **kwargs)
        return self._astream_events_v3(input, config, transformers, kwargs)

    async def _astream_events_v3(
        self,
        input: Any,
        config: Mapping[str, Any] | None,
        transformers: Sequence[Any] | None,
        kwargs: dict[str, Any],
    ) -> AsyncGraphRunStream:
        mux, run_config, options = self._event_mux(config, transformers, kwargs, is_async=True)
        return AsyncGraphRunStream(self.astream(input, run_config, **options).__aiter__(), mux)
