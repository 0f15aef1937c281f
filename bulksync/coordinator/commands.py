"""A ``Command`` given as run input, as the writes it stands for. Pure."""

from __future__ import annotations

import re
from typing import Any

from bulksync.constants import RESUME, START, TASKS
from bulksync.coordinator.spec import GraphSpec, Write
from bulksync.errors import InvalidGraphError, InvalidUpdateError
from bulksync.types import Command, Send

_INTERRUPT_ID = re.compile(r"^[0-9a-f]{32}$")


def is_resume_map(resume: Any) -> bool:
    """Whether ``resume`` maps interrupt ids to answers (rather than being one answer)."""
    return isinstance(resume, dict) and all(
        isinstance(k, str) and _INTERRUPT_ID.match(k) for k in resume
    )


def command_writes(cmd: Command[Any], spec: GraphSpec, *, resume_is_map: bool) -> list[Write]:
    """The input writes of ``cmd``: gotos, then the resume answer, then the update.

    Raises:
        InvalidUpdateError: ``graph=Command.PARENT`` on a graph with no parent.
        InvalidGraphError: a goto naming a node the graph does not have.
    """
    if cmd.graph == Command.PARENT:
        raise InvalidUpdateError("There is no parent graph: Command.PARENT needs a subgraph.")
    writes: list[Write] = []
    gotos = cmd.goto if isinstance(cmd.goto, (list, tuple)) else [cmd.goto] if cmd.goto else []
    for goto in gotos:
        target = goto.node if isinstance(goto, Send) else goto
        if target not in spec.nodes:
            raise InvalidGraphError(
                f"Command(goto={target!r}) names an unknown node; the graph has "
                f"{sorted(n for n in spec.nodes if not n.startswith('__'))}."
            )
        writes.append((TASKS, goto) if isinstance(goto, Send) else (f"branch:to:{goto}", START))
    if cmd.resume is not None and not resume_is_map:
        writes.append((RESUME, cmd.resume))
    writes.extend(cmd.update_items())
    return writes
