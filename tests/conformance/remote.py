"""The `remote` flavour: scenarios run through `RemoteGraph` on a coordinator service.

Each test gets a `RemoteService`: its own Postgres schema (so thread ids such as "1" never
meet another test's), a `Coordinator` serving on a thread of this process, and a `Client`.
Node tasks go to the session's in-process Celery worker (the `cluster` fixture), so nodes
closing over test-local objects still share them with the scenario.

`impl.compile(builder, …)` compiles the builder locally and returns a `RemoteHandle`. A
handle registers its graph with the worker and the coordinator on first use and answers the
graph's interface through `RemoteGraph`, with three exceptions, each because the scenario
uses the graph for something other than a detached run:

- added as a node of another graph (`remote.StateGraph.add_node`), the local compiled graph
  is the subgraph, as a graph's code would hold it on the cluster;
- called inside a running node (a worker thread), the local compiled graph runs, nested in
  that node's run as it would be in any node code;
- `get_graph()` describes the local compiled graph (structure, not a run).

`ainvoke`/`astream` are `RemoteGraph`'s own (its calls on a thread, a run cancelled with its
caller), so scenarios with async nodes still run those nodes on the cluster. Checkpoints
always go to the test's Postgres schema: `impl.saver()` is the coordinator's `PostgresSaver`,
whatever the graph was compiled with, and a graph compiled without a checkpointer is
checkpointed all the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import redis

from bulksync import keys
from bulksync.client import Client, RemoteGraph
from bulksync.context import maybe_current_task
from bulksync.graph import StateGraph as LocalStateGraph
from bulksync.graph.async_methods import AsyncGraphMethods
from bulksync.service.coordinator import Coordinator, open_coordinator
from bulksync.workers.registry import GraphRegistry

WAIT = 60.0
"""Seconds a call waits for its run before failing (never reached when all is well)."""

POLL = 0.05
"""Coordinator poll interval: the longest a run waits when its wake-up went elsewhere
(coordinators of other test sessions on the same Redis share the wake-up list)."""

HEARTBEAT = 2.0
"""Coordinator heartbeat; a lease lives three of them, far longer than any scenario step."""


class RemoteService:
    """One test's coordinator, client and registry, on the session's Celery worker."""

    def __init__(self, cluster: Any, coordinator: Coordinator, client: Client) -> None:
        self.cluster = cluster
        self.coordinator = coordinator
        self.client = client

    @property
    def saver(self) -> Any:
        """The coordinator's Postgres saver (the test's schema): what `impl.saver()` gives."""
        return self.coordinator.saver

    def register(self, graph: Any) -> str:
        """Serve `graph` on the worker and the coordinator; return its fresh graph id."""
        graph_id: str = self.cluster.register(graph)
        self.coordinator.registry.add(graph_id, graph)
        self.coordinator.announce()
        return graph_id

    def compile(self, builder: Any, **kw: Any) -> RemoteHandle:
        """Compile `builder` here; the handle runs it on the cluster."""
        return self.handle(builder.compile(**kw))

    def handle(self, graph: Any) -> RemoteHandle:
        """A compiled `graph` (e.g. an entrypoint's), run on the cluster through the handle."""
        return RemoteHandle(self, graph)


@contextmanager
def open_service(cluster: Any, database_url: str) -> Iterator[RemoteService]:
    """A coordinator serving `database_url` (a test's schema) until the block ends."""
    settings = dataclasses.replace(
        cluster.settings,
        database_url=database_url,
        max_runs=4,
        heartbeat=HEARTBEAT,
        poll_interval=POLL,
    )
    with ExitStack() as stack:
        coordinator = stack.enter_context(
            open_coordinator(settings, GraphRegistry(), app=cluster.app)
        )
        client = stack.enter_context(Client(settings))
        coordinator.start()
        try:
            yield RemoteService(cluster, coordinator, client)
        finally:
            coordinator.stop(timeout=WAIT)
            _drop_run_keys(client, settings.redis_url)


def _drop_run_keys(client: Client, redis_url: str) -> None:
    """Delete the Redis keys of this test's runs (they would otherwise live for days)."""
    run_ids = [run.run_id for run in client.list_runs(limit=100_000)]
    if not run_ids:
        return
    names = [k(r) for r in run_ids for k in (keys.events, keys.cancel, keys.run_steps)]
    with redis.Redis.from_url(redis_url) as conn:
        conn.delete(*names)


class RemoteHandle(AsyncGraphMethods):
    """What `impl.compile` returns in the `remote` flavour: a graph run through RemoteGraph."""

    def __init__(self, service: RemoteService, local: Any) -> None:
        self.service = service
        self.local = local
        self.__wrapped__ = local  # the graph a node's code reaches through this handle
        self._remote: RemoteGraph | None = None

    @property
    def remote(self) -> RemoteGraph:
        """The `RemoteGraph` of this graph (registered on first use)."""
        if self._remote is None:
            graph_id = self.service.register(self.local)
            self._remote = RemoteGraph(graph_id, self.service.client, timeout=WAIT)
        return self._remote

    def _target(self) -> Any:
        """The local graph inside a running node (nested there), else the remote one."""
        return self.local if maybe_current_task() is not None else self.remote

    def invoke(self, *args: Any, **kw: Any) -> Any:
        """`invoke` on the cluster (or nested, inside a node)."""
        return self._target().invoke(*args, **kw)

    def stream(self, *args: Any, **kw: Any) -> Iterator[Any]:
        """`stream` on the cluster (or nested, inside a node)."""
        chunks: Iterator[Any] = self._target().stream(*args, **kw)
        return chunks

    def get_state(self, *args: Any, **kw: Any) -> Any:
        """`get_state` read by the coordinator."""
        return self._target().get_state(*args, **kw)

    def get_state_history(self, *args: Any, **kw: Any) -> Iterator[Any]:
        """`get_state_history` read by the coordinator."""
        history: Iterator[Any] = self._target().get_state_history(*args, **kw)
        return history

    def update_state(self, *args: Any, **kw: Any) -> Any:
        """`update_state` run by the coordinator."""
        return self._target().update_state(*args, **kw)

    def bulk_update_state(self, *args: Any, **kw: Any) -> Any:
        """`bulk_update_state` run by the coordinator."""
        return self._target().bulk_update_state(*args, **kw)

    def with_config(self, *args: Any, **kw: Any) -> Any:
        """`with_config` of the remote graph (or of the local one, inside a node)."""
        return self._target().with_config(*args, **kw)

    def get_graph(self, *args: Any, **kw: Any) -> Any:
        """The local compiled graph's drawing (structure, not a run)."""
        return self.local.get_graph(*args, **kw)


class StateGraph(LocalStateGraph[Any]):
    """bulksync's builder, taking a `RemoteHandle` as a node as its local compiled graph."""

    def add_node(self, node: Any, action: Any = None, **kw: Any) -> Any:
        """`add_node`, with handles replaced by their local compiled graph."""
        if isinstance(node, RemoteHandle):
            node = node.local
        if isinstance(action, RemoteHandle):
            action = action.local
        return super().add_node(node, action, **kw)
