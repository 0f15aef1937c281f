"""What the run commands print: JSON documents and lines for scripts, tables for people.

``--json`` output is one JSON document per command (``submit``, ``runs``, ``state``,
``cancel``; ``submit --wait`` and ``resume --wait``: the run's final record), or JSON lines
where the data is a sequence that may be long or still growing (``history``: one checkpoint
a line; ``follow``: one event a line). Types JSON lacks are shown as their ``repr``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from typing import Any, TextIO

from bulksync.constants import INTERRUPT


def to_json(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON; dataclasses as objects, other non-JSON values as their repr."""
    return json.dumps(value, default=_plain, indent=indent, ensure_ascii=False)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    return repr(value)


def run_record(run: Any, *, output: bool = True) -> dict[str, Any]:
    """A run's row for ``--json``; with ``output``, its output and pending interrupts."""
    record: dict[str, Any] = {
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "graph_id": run.graph_id,
        "kind": run.kind,
        "status": run.status,
        "error": run.error,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
    }
    if output:
        record["output"] = run.output
        record["interrupts"] = [
            {"id": getattr(i, "id", None), "value": getattr(i, "value", i)}
            for i in interrupts_of(run)
        ]
    return record


def interrupts_of(run: Any) -> list[Any]:
    """The interrupts an ``interrupted`` run waits on (``Interrupt`` objects)."""
    if run.status != "interrupted" or not isinstance(run.output, dict):
        return []
    return list(run.output.get(INTERRUPT) or ())


def snapshot_record(snapshot: Any) -> dict[str, Any]:
    """A ``StateSnapshot`` as ``state``/``history`` print it: LangGraph's fields, plus the
    checkpoint id, parent id, step and source drawn out of its config and metadata."""
    metadata = snapshot.metadata or {}
    parent = snapshot.parent_config or {}
    return {
        "checkpoint_id": snapshot.config.get("configurable", {}).get("checkpoint_id"),
        "parent_checkpoint_id": parent.get("configurable", {}).get("checkpoint_id"),
        "step": metadata.get("step"),
        "source": metadata.get("source"),
        "created_at": snapshot.created_at,
        "values": snapshot.values,
        "next": snapshot.next,
        "tasks": [
            {"id": t.id, "name": t.name, "interrupts": t.interrupts, "error": t.error}
            for t in snapshot.tasks
        ],
        "interrupts": snapshot.interrupts,
        "metadata": snapshot.metadata,
        "config": snapshot.config,
        "parent_config": snapshot.parent_config,
    }


def print_table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Left-aligned columns, two spaces apart, the first row as the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def local_time(value: datetime.datetime | None) -> str:
    """A timestamp in the local zone, to the second ("" for none)."""
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
