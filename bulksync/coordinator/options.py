"""A run's settings as the loop uses them, and the metadata stored with each checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bulksync.constants import DEFAULT_RECURSION_LIMIT

# Config keys never copied into checkpoint metadata or task payloads.
EXCLUDED_METADATA_KEYS = frozenset(
    {
        "thread_id",
        "checkpoint_id",
        "checkpoint_ns",
        "checkpoint_map",
        "langgraph_step",
        "langgraph_node",
        "langgraph_triggers",
        "langgraph_path",
        "langgraph_checkpoint_ns",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class RunOptions:
    """How one run (or nested subgraph call) behaves."""

    config: Mapping[str, Any]
    recursion_limit: int = DEFAULT_RECURSION_LIMIT
    durability: str = "async"
    interrupt_before: Sequence[str] | str = ()
    interrupt_after: Sequence[str] | str = ()
    output_keys: Sequence[str] | str = ()
    modes: frozenset[str] = frozenset()
    subgraphs: bool = False
    """The caller reads the events of subgraphs too (``stream(subgraphs=True)``)."""
    context: Any = None
    control: Any = None
    """The run's ``runtime.RunControl`` (in this process only): a drain stops the run."""
    step_timeout: float | None = None
    """Seconds a step may take before its unfinished tasks are cancelled (``TimeoutError``)."""
    on_resume: Callable[[str], None] | None = None
    """Called with the checkpoint's id when the run goes on from a saved checkpoint."""

    @property
    def user_metadata(self) -> dict[str, Any]:
        """The caller's ``config["metadata"]`` minus engine keys."""
        meta = self.config.get("metadata") or {}
        return {k: v for k, v in meta.items() if k not in EXCLUDED_METADATA_KEYS}


def checkpoint_metadata(
    config: Mapping[str, Any], source: str, step: int, parents: dict[str, str]
) -> dict[str, Any]:
    """Metadata of a new checkpoint: source, step, parents, plus the caller's primitives."""
    metadata: dict[str, Any] = {"source": source, "step": step, "parents": parents}
    for obj in (config.get("metadata"), config.get("configurable")):
        for key, value in (obj or {}).items():
            if key in metadata or key in EXCLUDED_METADATA_KEYS or key.startswith("__"):
                continue
            if isinstance(value, (str, int, float, bool)):
                metadata[key] = value
    return metadata


def validate_recursion_limit(limit: Any) -> int:
    """The limit as an int.

    Raises:
        ValueError: a limit below 1 (or not an int).
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        # LangGraph raises a bare ValueError here; conformance compares the class name.
        raise ValueError(f"Recursion limit must be an integer >= 1, got {limit!r}.")
    return limit
