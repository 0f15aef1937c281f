"""The built-in projections of a v3 run.

One log per stream mode, scoped to the run's own namespace (``values``, ``updates``,
``custom``, ``checkpoints``, ``debug``, ``tasks``); ``lifecycle`` (a subgraph started,
completed, failed, was interrupted or drained) and ``subgraphs`` (a handle per child
subgraph, itself a run stream) are read from ``tasks`` events: a subgraph's namespace segment
is ``node:task_id``, it starts with its first task and ends with its parent task's result.
``messages`` lives in ``stream.messages``.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, NotRequired, TypedDict

from bulksync.errors import GraphDrained, GraphInterrupt
from bulksync.stream.channel import StreamChannel
from bulksync.stream.mux import ProtocolEvent, StreamMux, StreamTransformer
from bulksync.stream.run import AsyncSubgraphRunStream, SubgraphRunStream

logger = logging.getLogger(__name__)

SubgraphStatus = Literal["started", "completed", "failed", "interrupted", "drained"]


class LifecyclePayload(TypedDict, total=False):
    """One ``lifecycle`` item: a subgraph's namespace and what happened to it."""

    event: SubgraphStatus
    namespace: list[str]
    graph_name: NotRequired[str]
    trigger_call_id: NotRequired[str]
    cause: NotRequired[dict[str, Any]]
    error: NotRequired[str]


class _ModeLog(StreamTransformer):
    """The data of one stream mode's events at this scope, as a native projection."""

    _native = True
    mode: str = ""

    def __init__(self, scope: tuple[str, ...] = ()) -> None:
        super().__init__(scope)
        self._log: StreamChannel[Any] = StreamChannel()
        self._scope_list = list(scope)

    def init(self) -> dict[str, Any]:
        return {self.mode: self._log}

    def process(self, event: ProtocolEvent) -> bool:
        params = event["params"]
        if event["method"] == self.mode and params["namespace"] == self._scope_list:
            self._log.push(params["data"])
        return True


class ValuesTransformer(_ModeLog):
    """``run.values``: the state after each step."""

    mode = "values"
    required_stream_modes = ("values",)


class UpdatesTransformer(_ModeLog):
    """``run.updates``: each node's update."""

    mode = "updates"
    required_stream_modes = ("updates",)


class CustomTransformer(_ModeLog):
    """``run.custom``: what nodes write with their stream writer."""

    mode = "custom"
    required_stream_modes = ("custom",)


class CheckpointsTransformer(_ModeLog):
    """``run.checkpoints``: each checkpoint the run saves."""

    mode = "checkpoints"
    required_stream_modes = ("checkpoints",)


class DebugTransformer(_ModeLog):
    """``run.debug``: the debug stream's events."""

    mode = "debug"
    required_stream_modes = ("debug",)


class TasksTransformer(_ModeLog):
    """``run.tasks``: each task's start and result."""

    mode = "tasks"
    required_stream_modes = ("tasks",)


def _split_segment(segment: str) -> tuple[str, str | None]:
    """``node:task_id`` → ``(node, task_id)``; a bare name has no task id."""
    name, colon, task_id = segment.partition(":")
    return name, (task_id if colon else None)


def _end_of_result(data: dict[str, Any]) -> tuple[SubgraphStatus, str | None]:
    """How a subgraph ended, from its parent task's result payload."""
    if data.get("interrupts"):
        return "interrupted", None
    if data.get("error"):
        return "failed", str(data["error"])
    return "completed", None


def _end_of_error(err: BaseException) -> tuple[SubgraphStatus, str | None]:
    """How the subgraphs still open ended when the run ended with ``err``."""
    if isinstance(err, GraphDrained):
        return "drained", None
    if isinstance(err, GraphInterrupt):
        return "interrupted", None
    return "failed", str(err)


class _SubgraphTracker(StreamTransformer):
    """Reads subgraph starts and ends from ``tasks`` events (and keeps those events off
    the main log); subclasses say which namespaces they follow and what to do."""

    required_stream_modes = ("tasks",)

    def __init__(self, scope: tuple[str, ...] = ()) -> None:
        super().__init__(scope)
        self._seen: set[tuple[str, ...]] = set()
        self._open: dict[tuple[str, ...], str] = {}  # subgraph namespace -> parent task id
        self._tool_calls: dict[str, str] = {}  # task id -> the tool call it runs
        self._cause: dict[str, Any] | None = None

    def _follows(self, ns: tuple[str, ...]) -> bool:
        raise NotImplementedError

    def _started(
        self, ns: tuple[str, ...], graph_name: str | None, trigger_call_id: str | None
    ) -> None:
        raise NotImplementedError

    def _ended(self, ns: tuple[str, ...], status: SubgraphStatus, error: str | None) -> None:
        raise NotImplementedError

    def process(self, event: ProtocolEvent) -> bool:
        if event["method"] != "tasks":
            return True
        for child, status, error in self._on_task_event(event):
            self._ended(child, status, error)
        return False

    def _on_task_event(
        self, event: ProtocolEvent
    ) -> list[tuple[tuple[str, ...], SubgraphStatus, str | None]]:
        """Note a task's start (a subgraph may start with it); the subgraphs that end with
        a task's result, for the caller to end on its lane."""
        ns = tuple(event["params"]["namespace"])
        data = event["params"]["data"]
        if "result" in data:
            return self._ends_of(ns, data)
        self._note_tool_call(data)
        self._on_task_start(ns, data)
        return []

    def _note_tool_call(self, data: dict[str, Any]) -> None:
        """Remember the tool call a task runs (a ``Send`` of one, or a list of them)."""
        task_id, payload = data.get("id"), data.get("input")
        if not isinstance(task_id, str):
            return
        calls = [payload.get("tool_call")] if isinstance(payload, dict) else payload
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                self._tool_calls[task_id] = call["id"]
                return

    def _on_task_start(self, ns: tuple[str, ...], data: dict[str, Any]) -> None:
        if not self._follows(ns) or ns in self._seen:
            return
        self._seen.add(ns)
        name, trigger = _split_segment(ns[-1])
        agent = (data.get("metadata") or {}).get("lc_agent_name")
        self._cause = None
        if agent is not None and trigger is not None and trigger in self._tool_calls:
            self._cause = {"type": "toolCall", "tool_call_id": self._tool_calls[trigger]}
        self._started(ns, agent if agent is not None else (name or None), trigger)
        if trigger is not None:
            self._open[ns] = trigger

    def _ends_of(
        self, ns: tuple[str, ...], data: dict[str, Any]
    ) -> list[tuple[tuple[str, ...], SubgraphStatus, str | None]]:
        """The subgraphs the task whose result this is ran (they end with it)."""
        task_id = data.get("id")
        ends = []
        for child, parent_task in list(self._open.items()):
            if task_id and parent_task == task_id and child[:-1] == ns:
                ends.append((child, *_end_of_result(data)))
                del self._open[child]
        return ends

    def finalize(self) -> None:
        for ns in list(self._open):
            self._ended(ns, "completed", None)
        self._open.clear()

    def fail(self, err: BaseException) -> None:
        status, error = _end_of_error(err)
        for ns in list(self._open):
            self._ended(ns, status, error)
        self._open.clear()


class LifecycleTransformer(_SubgraphTracker):
    """``run.lifecycle``: each subgraph below this scope (at any depth) as it starts and
    ends; also on the main log, as ``lifecycle`` events."""

    _native = True

    def __init__(self, scope: tuple[str, ...] = ()) -> None:
        super().__init__(scope)
        self._channel: StreamChannel[LifecyclePayload] = StreamChannel("lifecycle")

    def init(self) -> dict[str, Any]:
        return {"lifecycle": self._channel}

    def _follows(self, ns: tuple[str, ...]) -> bool:
        return len(ns) > len(self.scope) and ns[: len(self.scope)] == self.scope

    def _started(
        self, ns: tuple[str, ...], graph_name: str | None, trigger_call_id: str | None
    ) -> None:
        if trigger_call_id is None:
            return
        payload: LifecyclePayload = {"event": "started", "namespace": list(ns)}
        if graph_name:
            payload["graph_name"] = graph_name
        payload["trigger_call_id"] = trigger_call_id
        if self._cause is not None:
            payload["cause"] = self._cause
        self._channel.push(payload)

    def _ended(self, ns: tuple[str, ...], status: SubgraphStatus, error: str | None) -> None:
        payload: LifecyclePayload = {"event": status, "namespace": list(ns)}
        if error is not None:
            payload["error"] = error
        self._channel.push(payload)


Handle = SubgraphRunStream | AsyncSubgraphRunStream


class SubgraphTransformer(_SubgraphTracker):
    """``run.subgraphs``: a handle (a run stream of its own) for each child subgraph of
    this scope, fed with every event from inside it."""

    _native = True
    supports_sync = True

    def __init__(self, scope: tuple[str, ...] = ()) -> None:
        super().__init__(scope)
        self._log: StreamChannel[Handle] = StreamChannel()
        self._handles: dict[tuple[str, ...], Handle] = {}
        self._mux: StreamMux | None = None

    def init(self) -> dict[str, Any]:
        return {"subgraphs": self._log}

    def _on_register(self, mux: StreamMux) -> None:
        self._mux = mux

    def _follows(self, ns: tuple[str, ...]) -> bool:
        depth = len(self.scope)
        return len(ns) == depth + 1 and ns[:depth] == self.scope

    def _started(
        self, ns: tuple[str, ...], graph_name: str | None, trigger_call_id: str | None
    ) -> None:
        if self._mux is None or self._mux._factories is None:
            return
        child = self._mux._make_child(ns)
        cls = AsyncSubgraphRunStream if child.is_async else SubgraphRunStream
        handle = cls(child, path=ns, graph_name=graph_name, trigger_call_id=trigger_call_id)
        self._handles[ns] = handle
        self._log.push(handle)

    def _settle(self, handle: Handle, status: SubgraphStatus, error: str | None) -> bool:
        """Record how ``handle`` ended (once); True if it had not ended before."""
        if handle._seen_terminal:
            return False
        handle.status = status
        handle.error = handle.error or error
        handle._seen_terminal = True
        return True

    def _ended(self, ns: tuple[str, ...], status: SubgraphStatus, error: str | None) -> None:
        handle = self._handles.get(ns)
        if handle is None or not self._settle(handle, status, error):
            return
        if not handle._mux._events._closed:
            if status == "failed":
                handle._mux.fail(RuntimeError(error or "Subgraph failed"))
            else:
                handle._mux.close()

    async def _aended(self, ns: tuple[str, ...], status: SubgraphStatus, error: str | None) -> None:
        handle = self._handles.get(ns)
        if handle is None or not self._settle(handle, status, error):
            return
        if not handle._mux._events._closed:
            if status == "failed":
                await handle._mux.afail(RuntimeError(error or "Subgraph failed"))
            else:
                await handle._mux.aclose()

    def _handle_of(self, event: ProtocolEvent) -> Handle | None:
        """The open handle of the child subgraph ``event`` comes from (at any depth)."""
        ns = tuple(event["params"]["namespace"])
        depth = len(self.scope)
        handle = self._handles.get(ns[: depth + 1]) if len(ns) > depth else None
        if handle is None or handle._mux._events._closed:
            return None
        return handle

    def process(self, event: ProtocolEvent) -> bool:
        keep = super().process(event)
        if (handle := self._handle_of(event)) is not None:
            handle._observe_event(event)
            handle._mux.push(event)
        return keep

    async def aprocess(self, event: ProtocolEvent) -> bool:
        keep = event["method"] != "tasks"
        if not keep:
            for child, status, error in self._on_task_event(event):
                await self._aended(child, status, error)
        if (handle := self._handle_of(event)) is not None:
            handle._observe_event(event)
            await handle._mux.apush(event)
        return keep

    def _still_open(self) -> list[tuple[str, ...]]:
        opened = list(self._open)
        self._open.clear()
        return opened + [ns for ns in self._handles if ns not in opened]

    def finalize(self) -> None:
        first: BaseException | None = None
        for ns in self._still_open():
            try:
                self._ended(ns, "completed", None)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    async def afinalize(self) -> None:
        first: BaseException | None = None
        for ns in self._still_open():
            try:
                await self._aended(ns, "completed", None)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    def fail(self, err: BaseException) -> None:
        status, error = _end_of_error(err)
        self._open.clear()
        for handle in self._handles.values():
            self._settle(handle, status, error)
            if not handle._mux._events._closed:
                handle._mux.fail(err)

    async def afail(self, err: BaseException) -> None:
        status, error = _end_of_error(err)
        self._open.clear()
        for handle in self._handles.values():
            self._settle(handle, status, error)
            if not handle._mux._events._closed:
                await handle._mux.afail(err)
