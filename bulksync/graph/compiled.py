"""``CompiledStateGraph``: run a graph and read its threads, with LangGraph's interface.

Every run drives one ``SuperstepLoop`` over an executor (in-process threads by default):
``invoke``, ``stream`` and ``start`` are ``running.py``'s. Here are the rest: a graph's
copies (``with_executor``, ``with_config``, …), its threads' state and history, its
subgraphs, its cache and its drawing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.config import merge_configs
from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, NS_END, NS_SEP
from bulksync.coordinator import state as thread_state
from bulksync.coordinator.executor import Executor
from bulksync.coordinator.nested import recast_namespace
from bulksync.coordinator.spec import GraphSpec
from bulksync.errors import GraphInterrupt
from bulksync.graph.async_methods import AsyncGraphMethods, in_thread, in_threads
from bulksync.graph.invoked import invoked_graph
from bulksync.graph.langchain_graph import langchain_available, to_langchain_graph
from bulksync.graph.layout import builder_drawable
from bulksync.graph.running import GraphRuns
from bulksync.stream.mux import TransformerFactory
from bulksync.types import StateSnapshot
from bulksync.workers.local import LocalExecutor


class CompiledStateGraph(GraphRuns, AsyncGraphMethods):
    """A compiled ``StateGraph``: ``invoke``, ``stream``, ``get_state``, ``update_state``, …"""

    def __init__(
        self,
        *,
        builder: Any,
        spec: GraphSpec,
        checkpointer: CheckpointSaver | bool | None = None,
        debug: bool = False,
        name: str = "LangGraph",
        executor: Executor | None = None,
        stream_transformers: Sequence[TransformerFactory] = (),
        step_timeout: float | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.builder = builder
        self.config = config
        """The config every run starts from (``with_config``), under the one it is given."""
        self.step_timeout = step_timeout
        """Seconds a step may take (LangGraph's attribute, set after compiling): past them
        its unfinished tasks are cancelled and the run fails with ``TimeoutError``."""
        self.stream_transformers = stream_transformers
        self.spec = spec
        self.checkpointer = checkpointer
        self.debug = debug
        self.name = name
        self.executor: Executor = executor or LocalExecutor()
        self.interrupt_before = spec.interrupt_before
        self.interrupt_after = spec.interrupt_after

    @property
    def store(self) -> Any:
        """The store given at compile time (``compile(store=...)``), or None."""
        return self.spec.store

    @property
    def saver(self) -> CheckpointSaver | None:
        """The saver of a root run (``True``/``False`` only mean something for subgraphs)."""
        cp = self.checkpointer
        return None if cp is None or isinstance(cp, bool) else cp

    def with_executor(self, executor: Executor) -> CompiledStateGraph:
        """The same graph, run by ``executor`` (e.g. a cluster executor)."""
        return self._copy(executor=executor)

    def with_config(
        self, config: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> CompiledStateGraph:
        """The same graph, each run's config merged over ``config`` (and ``kwargs``, as config
        keys): LangChain's Runnable ``with_config``."""
        return self._copy(config=merge_configs(self.config, {**(config or {}), **kwargs}))

    def with_checkpointer(self, checkpointer: CheckpointSaver | None) -> CompiledStateGraph:
        """The same graph and executor, checkpointing to ``checkpointer`` (e.g. a fenced saver)."""
        return self._copy(checkpointer=checkpointer)

    def _copy(self, **changes: Any) -> CompiledStateGraph:
        settings = {
            "builder": self.builder,
            "spec": self.spec,
            "checkpointer": self.checkpointer,
            "debug": self.debug,
            "name": self.name,
            "executor": self.executor,
            "stream_transformers": self.stream_transformers,
            "step_timeout": self.step_timeout,
            "config": self.config,
        }
        return type(self)(**(settings | changes))

    # -- thread state -------------------------------------------------------------------

    def _require_saver(self) -> CheckpointSaver:
        if self.saver is None:
            # LangGraph raises a bare ValueError here; conformance compares the class name.
            raise ValueError("No checkpointer set: compile the graph with checkpointer=...")
        return self.saver

    def get_state(self, config: Mapping[str, Any], *, subgraphs: bool = False) -> StateSnapshot:
        """The thread's current state (or at ``checkpoint_id``), with its next tasks."""
        saver = self._require_saver()
        conf = config.get("configurable") or {}
        sub = self._subgraph_for(conf.get(CHECKPOINT_NS, ""))
        if sub is not None:
            return sub.get_state_at(saver, config, subgraphs=subgraphs)
        return self.get_state_at(saver, config, subgraphs=subgraphs)

    def get_state_at(
        self, saver: CheckpointSaver, config: Mapping[str, Any], *, subgraphs: bool
    ) -> StateSnapshot:
        """``get_state`` against an explicit saver (a subgraph reads its parent's)."""
        saved = saver.get_tuple(config)
        live = not (config.get("configurable") or {}).get(CHECKPOINT_ID)
        states = self._task_states(saver, saved, subgraphs) if saved is not None else None
        return thread_state.snapshot(self.spec, saved, config, live=live, task_states=states)

    def _task_states(self, saver: CheckpointSaver, saved: Any, recurse: bool) -> dict[str, Any]:
        channels, _ = thread_state.load_channels(self.spec, saved)
        tasks = thread_state.plan_after(self.spec, saved, channels)
        thread = saved.config["configurable"].get("thread_id")
        states: dict[str, Any] = {}
        for task in tasks.values():
            subgraph = self.spec.nodes[task.name].subgraph
            invoked = subgraph is None  # maybe a graph the node's function invokes
            if invoked:
                subgraph = self._invoked(task.name)
            if not isinstance(subgraph, CompiledStateGraph):
                continue
            ns = task.checkpoint_ns
            if subgraph.checkpointer is True:  # one history, stored without task ids
                ns = recast_namespace(ns)
            lookup = {"configurable": {"thread_id": thread, CHECKPOINT_NS: ns}}
            if invoked and saver.get_tuple(lookup) is None:
                continue
            sub_config = {"configurable": {"thread_id": thread, CHECKPOINT_NS: ns}}
            states[task.id] = (
                subgraph.get_state_at(saver, sub_config, subgraphs=True) if recurse else sub_config
            )
        return states

    def _invoked(self, node: str) -> Any:
        """The compiled graph node ``node``'s function invokes, if it reaches exactly one."""
        spec = self.builder.nodes.get(node)
        return invoked_graph(spec.action) if spec is not None else None

    def _subgraph_for(self, ns: str, *, for_update: bool = False) -> CompiledStateGraph | None:
        """The subgraph a namespaced config addresses, segment by segment: a subgraph node,
        or the graph a node's function invokes (a numbered segment is a repeated call of
        it). None for no namespace, or one naming no such subgraph (a graph a tool invokes,
        say): as in LangGraph, a read then uses this graph's channels.

        Raises:
            ValueError: ``for_update`` and the namespace names no subgraph (this graph's
                nodes would write the wrong state into it), in LangGraph's words.
        """
        if not ns:
            return None
        graph: CompiledStateGraph = self
        for part in ns.split(NS_SEP):
            name = part.split(NS_END)[0]
            if name.isdigit():
                continue
            node = graph.spec.nodes.get(name)
            sub = node.subgraph if node is not None else None
            if node is not None and sub is None:
                sub = graph._invoked(name)
            if not isinstance(sub, CompiledStateGraph):
                if for_update:
                    raise ValueError(f"Subgraph {recast_namespace(ns)} not found")
                return None
            graph = sub
        return graph

    def get_state_history(
        self,
        config: Mapping[str, Any],
        *,
        filter: Mapping[str, Any] | None = None,
        before: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> Iterator[StateSnapshot]:
        """The thread's checkpoints, newest first, as snapshots."""
        saver = self._require_saver()
        conf = dict(config.get("configurable") or {})
        conf.setdefault(CHECKPOINT_NS, "")
        graph = self._subgraph_for(conf[CHECKPOINT_NS]) or self
        for saved in saver.list({"configurable": conf}, filter=filter, before=before, limit=limit):
            # A subgraph's task points at the subgraph's checkpoints, as in get_state.
            states = graph._task_states(saver, saved, recurse=False)
            yield thread_state.snapshot(
                graph.spec, saved, saved.config, live=False, task_states=states
            )

    def update_state(
        self,
        config: Mapping[str, Any],
        values: Any,
        as_node: str | None = None,
        task_id: str | None = None,
    ) -> dict[str, Any]:
        """Apply ``values`` as if ``as_node`` returned them; return the new checkpoint's config."""
        return self.bulk_update_state(config, [[(values, as_node, task_id)]])

    def bulk_update_state(
        self, config: Mapping[str, Any], supersteps: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        """Apply several supersteps of updates, a checkpoint each; the last one's config.

        Each superstep is a list of ``(values, as_node[, task_id])`` (LangGraph's
        ``StateUpdate``), applied together as those nodes' outputs.

        Raises:
            ValueError: no supersteps, or a superstep without updates (LangGraph's errors).
            InvalidUpdateError: as ``update_state``.
        """
        if not supersteps:
            raise ValueError("No supersteps provided")
        if any(len(updates) == 0 for updates in supersteps):
            raise ValueError("No updates provided")
        saver = self._require_saver()
        ns = (config.get("configurable") or {}).get(CHECKPOINT_NS, "")
        graph = self._subgraph_for(ns, for_update=True) or self  # a subgraph's nodes write
        current = dict(config)
        for updates in supersteps:
            given = [(u[0], u[1], u[2] if len(u) > 2 else None) for u in updates]
            current = thread_state.update_state(graph.spec, saver, current, given)
        return current

    def get_subgraphs(
        self, *, namespace: str | None = None, recurse: bool = False
    ) -> Iterator[tuple[str, CompiledStateGraph]]:
        """The subgraphs added as nodes, as ``(name, graph)``: all of them, or the one named
        ``namespace``; ``recurse`` adds theirs, named ``node|child`` (and lets ``namespace``
        name a nested one)."""
        for name, node in self.builder.nodes.items():
            sub = node.subgraph
            inside = namespace is not None and namespace.startswith(f"{name}{NS_SEP}")
            if sub is None or (namespace is not None and namespace != name and not inside):
                continue  # namespaces match whole segments: "research" is not "research_x"
            if namespace == name:
                yield name, sub
                return
            if namespace is None:
                yield name, sub
            if recurse:
                inner = None if namespace is None else namespace[len(name) + 1 :]
                for child, graph in sub.get_subgraphs(namespace=inner, recurse=recurse):
                    yield f"{name}{NS_SEP}{child}", graph

    def aget_subgraphs(
        self, *, namespace: str | None = None, recurse: bool = False
    ) -> AsyncIterator[tuple[str, CompiledStateGraph]]:
        """``get_subgraphs`` for async callers."""
        return in_threads(self.get_subgraphs(namespace=namespace, recurse=recurse))

    def clear_cache(self, nodes: Sequence[str] | None = None) -> None:
        """Drop the cached results of ``nodes`` (None: every node) from the graph's cache.

        Raises:
            ValueError: the graph was compiled without a cache.
        """
        cache = self.spec.cache
        if cache is None:
            raise ValueError("No cache is set for this graph: compile it with cache=... first.")
        names = self.spec.nodes if nodes is None else nodes
        known = [self.spec.nodes[n] for n in names if n in self.spec.nodes]
        cache.clear([node.cache_ns for node in known if node.cache_ns])

    async def aclear_cache(self, nodes: Sequence[str] | None = None) -> None:
        """``clear_cache`` for async callers."""
        await in_thread(self.clear_cache, nodes)

    def get_graph(
        self, config: Mapping[str, Any] | None = None, *, xray: bool | int = False
    ) -> Any:
        """The graph's drawing: LangChain's ``Graph`` when langchain-core is installed (for
        ``draw_mermaid_png``, ``draw_ascii``, …), else bulksync's ``DrawableGraph``; both
        draw LangGraph's Mermaid. ``xray`` expands subgraphs (all levels, or that many)."""
        drawing = builder_drawable(self.builder, self.spec, xray=xray)
        if not langchain_available():
            return drawing
        actions = {name: node.action for name, node in self.builder.nodes.items()}
        return to_langchain_graph(drawing, actions)


__all__ = ["CompiledStateGraph", "GraphInterrupt"]
