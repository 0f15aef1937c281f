"""A loop's stream chunks, held until the point where LangGraph's stream would hand them out.

Chunks are built as the loop goes (``stream.py`` gives their shapes) and reach the sink only
on ``flush``, so a step that fails drops the same chunks LangGraph's does. A ``debug`` stream
gets a wrapped copy of every ``tasks`` and ``checkpoints`` chunk, a ``TASK_STEPS`` one of
every ``tasks`` chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bulksync.channels.base import BaseChannel
from bulksync.checkpoint.base import PendingWrite
from bulksync.constants import INTERRUPT
from bulksync.coordinator import stream
from bulksync.coordinator.executor import StreamSink
from bulksync.coordinator.nested import subgraph_task_states
from bulksync.coordinator.options import RunOptions
from bulksync.coordinator.plan import Task
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.types import Interrupt


class StreamBuffer:
    """Builds one loop's chunks for the modes it streams and hands them to its sink."""

    def __init__(
        self, sink: StreamSink, namespace: tuple[str, ...], spec: GraphSpec, options: RunOptions
    ) -> None:
        self.sink = sink
        self.namespace = namespace
        self.modes = options.modes
        self.keys: stream.Keys = options.output_keys or spec.stream_channels
        self._stream_channels = spec.stream_channels
        self._subgraphs = {n.name: n.subgraph for n in spec.nodes.values() if n.subgraph}
        self._user_metadata = options.user_metadata
        self._chunks: list[tuple[str, Any]] = []

    def flush(self) -> None:
        """Hand the held chunks to the sink, in order."""
        chunks, self._chunks = self._chunks, []
        for mode, chunk in chunks:
            self.sink(self.namespace, mode, chunk)

    def emit(self, mode: str, chunk: Any, *, step: int = 0) -> None:
        """Hold ``chunk`` if the loop streams ``mode`` (``step`` dates its debug copy)."""
        if mode in self.modes:
            self._chunks.append((mode, chunk))
        for wrapper in self._wrappers(mode):
            self._chunks.append((wrapper, stream.debug_event(mode, step, chunk)))

    def wants(self, mode: str) -> bool:
        """Whether a ``mode`` chunk would be held: a chunk nobody reads is not built."""
        return mode in self.modes or bool(self._wrappers(mode))

    def _wrappers(self, mode: str) -> list[str]:
        """The streamed modes that hold a ``mode`` chunk wrapped as a debug event."""
        wrappers = ["debug"] if mode in ("tasks", "checkpoints") else []
        if mode == "tasks":
            wrappers.append(stream.TASK_STEPS)
        return [w for w in wrappers if w in self.modes]

    def values(self, channels: Mapping[str, BaseChannel[Any, Any]]) -> None:
        """The output keys as they are now."""
        if self.wants("values"):
            self.emit("values", stream.read_channels(channels, self.keys))

    def task_start(self, task: Task) -> None:
        """A task of the step is about to run."""
        if self.wants("tasks") and not stream.is_hidden(task):
            self.emit("tasks", stream.task_start(task, self._user_metadata), step=task.step)

    def update(self, task: Task, writes: Sequence[Write], *, cached: bool) -> None:
        """A task finished with ``writes`` (``cached``: recorded before this run)."""
        if self.wants("updates") and not stream.is_hidden(task):
            self.emit("updates", stream.update_chunk(task, writes, self.keys, cached=cached))

    def result(self, task: Task, writes: Sequence[Write]) -> None:
        """A task's result, for the ``tasks`` mode."""
        if self.wants("tasks") and not stream.is_hidden(task):
            self.emit("tasks", stream.task_result(task, writes, self.keys), step=task.step)

    def interrupts(
        self, channels: Mapping[str, BaseChannel[Any, Any]], interrupts: Sequence[Interrupt]
    ) -> None:
        """A task paused on ``interrupts``."""
        self.paused(interrupts)
        if "values" not in self.modes:
            return
        values = stream.read_channels(channels, self.keys)
        if isinstance(values, dict):
            values[INTERRUPT] = tuple(interrupts)
            self.emit("values", values)
        else:
            self.emit("values", {INTERRUPT: tuple(interrupts)})

    def paused(self, interrupts: Sequence[Interrupt]) -> None:
        """The ``updates`` chunk of a pause on ``interrupts`` (none: a pause before or after
        a node), under ``PAUSES`` too."""
        self.emit("updates", {INTERRUPT: tuple(interrupts)})
        self.emit(stream.PAUSES, {INTERRUPT: tuple(interrupts)})

    def checkpoint(
        self,
        config: Mapping[str, Any],
        parent_config: Mapping[str, Any] | None,
        channels: Mapping[str, BaseChannel[Any, Any]],
        metadata: Mapping[str, Any],
        tasks: Sequence[Task],
        pending: Sequence[PendingWrite],
        step: int,
    ) -> None:
        """The checkpoint a step plans from, with its tasks (``step``: the checkpoint's)."""
        if "checkpoints" not in self.modes and "debug" not in self.modes:
            return
        payload = stream.checkpoint_payload(
            config,
            parent_config,
            stream.read_channels(channels, self._stream_channels),
            metadata,
            list(tasks),
            pending,
            self.keys,
            subgraph_task_states(self._subgraphs, config, tasks),
        )
        self.emit("checkpoints", payload, step=step)
