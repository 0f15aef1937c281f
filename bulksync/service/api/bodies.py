"""The bodies the HTTP API takes, by the Agent Server's field names, and what they become.

Each body is a pydantic model: a field of the wrong type is refused with 422 naming it
before anything changes. Fields the Agent Server has and bulksync does not act on are
refused too when they would change what a run does (``webhook``, ``after_seconds``, the
``interrupt``/``rollback`` strategies); fields that only tune tracing or feedback are
accepted and ignored, as extra fields are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bulksync.constants import CHECKPOINT_ID, CHECKPOINT_NS, THREAD_ID
from bulksync.coordinator.stream import check_modes
from bulksync.errors import ConfigError
from bulksync.service.submit import run_options, run_payload
from bulksync.types import Command, Send

# LangGraph's clients ask for "messages-tuple" (RemoteGraph replaces "messages" with it): both
# are bulksync's messages mode, (message, metadata) pairs.
MODE_ALIASES = {"messages-tuple": "messages"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CheckpointRef(_Body):
    """Which checkpoint: the thread's (``thread_id``), a subgraph's (``checkpoint_ns``), one
    (``checkpoint_id``); missing parts mean "the latest"."""

    thread_id: str | None = None
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None
    checkpoint_map: dict[str, Any] | None = None


class CommandBody(_Body):
    """``Command`` as the clients send it; ``goto: []`` means no goto."""

    update: dict[str, Any] | list[tuple[str, Any]] | None = None
    resume: Any = None
    goto: str | dict[str, Any] | list[str | dict[str, Any]] | None = None


class RunCreate(_Body):
    """A run to start on a thread (or on a new thread, for ``/runs``)."""

    assistant_id: str
    input: Any = None
    command: CommandBody | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None
    stream_mode: str | list[str] = "values"
    stream_subgraphs: bool = False
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    multitask_strategy: Literal["reject", "enqueue"] = "enqueue"
    if_not_exists: Literal["create", "reject"] = "reject"
    on_disconnect: Literal["cancel", "continue"] = "continue"
    on_completion: Literal["delete", "keep"] | None = None
    webhook: None = Field(None, description="not supported: leave it out")
    after_seconds: None = Field(None, description="not supported: leave it out")

    def modes(self) -> list[str]:
        """The stream modes asked for, by bulksync's names.

        Raises:
            ConfigError: a mode bulksync does not stream (named).
        """
        asked = [self.stream_mode] if isinstance(self.stream_mode, str) else self.stream_mode
        modes = list(dict.fromkeys(MODE_ALIASES.get(m, m) for m in asked))
        check_modes(modes)
        return modes

    def value(self) -> Any:
        """The run's input: the ``command`` when one is given, else ``input``."""
        if self.command is None:
            return self.input
        return _command(self.command)

    def payload(self, thread_id: str, modes: list[str]) -> dict[str, Any]:
        """The run's payload for the runs table (as ``Client.create_run`` takes it)."""
        config = dict(self.config or {})
        configurable = {**(config.get("configurable") or {}), THREAD_ID: thread_id}
        point = self.checkpoint.model_dump(exclude_none=True) if self.checkpoint else {}
        if self.checkpoint_id:
            point[CHECKPOINT_ID] = self.checkpoint_id
        point.pop(THREAD_ID, None)
        configurable.update(point)
        config["configurable"] = configurable
        options = run_options(
            None, self.interrupt_before, self.interrupt_after, self.durability, self.context
        )
        payload = run_payload(self.value(), config, modes, self.stream_subgraphs, options)
        payload["metadata"] = dict(self.metadata or {})
        return payload


def _command(body: CommandBody) -> Command[Any]:
    goto: Any = body.goto or ()
    if isinstance(goto, str | dict):
        goto = [goto]
    targets = [_send(g) if isinstance(g, dict) else g for g in goto]
    update = body.update
    if isinstance(update, list):
        update = [tuple(pair) for pair in update]
    return Command(update=update, resume=body.resume, goto=tuple(targets))


def _send(record: Mapping[str, Any]) -> Send:
    if "node" not in record:
        raise ConfigError(f"command.goto item {dict(record)!r}: a Send needs 'node' (and 'input')")
    return Send(record["node"], record.get("input"))


class ThreadCreate(_Body):
    """A thread to create (``if_exists="do_nothing"`` returns one that exists)."""

    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    supersteps: list[dict[str, Any]] | None = None


class ThreadPatch(_Body):
    """Metadata to merge into a thread's."""

    metadata: dict[str, Any]


class ThreadSearch(_Body):
    """Which threads to list (every filter given must match), and which page."""

    metadata: dict[str, Any] | None = None
    ids: list[str] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    graph_id: str | None = None
    limit: Annotated[int, Field(ge=0, le=1000)] = 10
    offset: Annotated[int, Field(ge=0)] = 0
    sort_by: Literal["thread_id", "created_at", "updated_at", "status"] = "created_at"
    sort_order: Literal["asc", "desc"] = "desc"


class AssistantSearch(_Body):
    """Which assistants to list: every graph loaded, or those matching."""

    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: Annotated[int, Field(ge=0, le=1000)] = 10
    offset: Annotated[int, Field(ge=0)] = 0


class StateAt(_Body):
    """A thread's state at a checkpoint (``POST /threads/{id}/state/checkpoint``)."""

    checkpoint: CheckpointRef = Field(default_factory=CheckpointRef)
    subgraphs: bool = False


class StateUpdate(_Body):
    """Values applied to a thread as if ``as_node`` returned them."""

    values: Any = None
    as_node: str | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None


class HistoryQuery(_Body):
    """A thread's checkpoints, newest first."""

    limit: Annotated[int, Field(ge=1, le=10_000)] = 10
    before: str | CheckpointRef | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None


def thread_config(
    thread_id: str, point: CheckpointRef | None = None, checkpoint_id: str | None = None
) -> dict[str, Any]:
    """The config naming the thread's checkpoint ``point`` (its latest when not given)."""
    configurable: dict[str, Any] = {THREAD_ID: thread_id, CHECKPOINT_NS: ""}
    if point is not None:
        configurable.update(point.model_dump(exclude_none=True))
        configurable[THREAD_ID] = thread_id
    if checkpoint_id:
        configurable[CHECKPOINT_ID] = checkpoint_id
    if not configurable.get(CHECKPOINT_ID):
        configurable.pop(CHECKPOINT_ID, None)
    return {"configurable": configurable}
