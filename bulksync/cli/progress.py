"""The progress line of ``submit --wait``, ``resume --wait`` and ``follow``, on stderr.

It says where the run is: queued (waiting for a coordinator serving its graph) while the run
is pending, then its step and per node the tasks done, running and queued, from the run's
``progress`` events (``service/driver.py``'s ``_Tracker``), with the time since the command
started and since the step started. Its clock moves even when no event comes (``tick``).

On a terminal it is one line redrawn in place (``\\r``, the text, ``\\x1b[K`` to clear what
a longer line left) cut to the terminal's width. Anywhere else (a file, a pipe, CI logs) it
is plain lines: one when the text changes, at most one a second, clocks aside.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

PLAIN_EVERY: Final = 1.0
"""Seconds between two plain progress lines, at least."""
DEFAULT_WIDTH: Final = 80
CLEAR_TO_END: Final = "\x1b[K"


class ProgressLine:
    """The progress of one run, drawn on ``err``.

    ``tty`` and ``width`` default to what ``err`` is: a terminal (its width read at every
    redraw, so a resized window is followed) or not.
    """

    def __init__(
        self,
        err: TextIO,
        graph_id: str,
        *,
        tty: bool | None = None,
        width: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.err = err
        self.graph_id = graph_id
        self.tty = _is_tty(err) if tty is None else tty
        self.width = width
        self.clock = clock
        self.started = clock()
        self.status = "pending"
        self.chunk: dict[str, Any] | None = None
        self.chunk_at = 0.0
        self.printed: str | None = None  # plain mode: the last text printed, clocks aside
        self.printed_at = float("-inf")
        self.drawn = False  # tty mode: a line is on screen and needs its newline

    @property
    def pending(self) -> bool:
        """Whether the run is still waiting for a coordinator, as far as this line knows."""
        return self.status == "pending"

    def set_status(self, status: str) -> None:
        """The run's status from its row (``pending``, ``running``, …)."""
        if status != self.status:
            self.status = status
            self.draw()

    def progress(self, chunk: dict[str, Any]) -> None:
        """A ``progress`` event: the run is running, at this step."""
        self.status = "running"
        self.chunk, self.chunk_at = chunk, self.clock()
        self.draw()

    def tick(self) -> None:
        """Redraw for the clock (no event came for a while)."""
        self.draw()

    def finish(self, status: str) -> None:
        """Draw the final status and end the line."""
        self.status = status
        self.chunk = None
        self.draw(force=True)
        self.close()

    def close(self) -> None:
        """End a line left drawn (before anything else is printed on ``err``)."""
        if self.drawn:
            self._write("\n")
            self.drawn = False

    def text(self, clocks: bool = True) -> str:
        """The line as it reads now (``clocks=False``: without the times, to see changes)."""
        now = self.clock()
        if self.status == "pending":
            body = f"queued, waiting for a coordinator serving {self.graph_id}"
        elif self.status == "running" and self.chunk is not None:
            step_s = self.chunk.get("elapsed_s", 0.0) + now - self.chunk_at
            body = progress_text(self.chunk, step_s if clocks else None)
        else:
            body = self.status
        return f"{format_seconds(now - self.started)} · {body}" if clocks else body

    def draw(self, *, force: bool = False) -> None:
        """Show the line: redrawn in place on a terminal, else printed if it changed."""
        if self.tty:
            line = fit(self.text(), self._columns() - 1)  # the last column would wrap
            self._write(f"\r{line}{CLEAR_TO_END}")
            self.drawn = True
            return
        now, key = self.clock(), self.text(clocks=False)
        if key != self.printed and (force or now - self.printed_at >= PLAIN_EVERY):
            self._write(self.text() + "\n")
            self.printed, self.printed_at = key, now

    def _columns(self) -> int:
        if self.width is not None:
            return self.width
        try:
            columns = os.get_terminal_size(self.err.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
        return columns if columns > 1 else DEFAULT_WIDTH

    def _write(self, text: str) -> None:
        self.err.write(text)
        self.err.flush()


def progress_text(chunk: dict[str, Any], step_s: float | None = None) -> str:
    """One progress event as the progress line shows it, most telling first (the line is
    cut at the terminal's width): the step (and for how long it has run), its tasks done —
    under the node's name when the step runs one node — failed, queued and running (on how
    many workers, the longest for how long) once the coordinator has looked, queues no
    worker takes from, then per node when the step runs several."""
    step = f"step {chunk['step']}" + ("" if step_s is None else f" ({format_seconds(step_s)})")
    # The tracker's per-node counts (with totals); a bare executor chunk has none.
    nodes = {n: c for n, c in (chunk.get("nodes") or {}).items() if "total" in c}
    failed = sum(c.get("failed", 0) for c in nodes.values())
    label = next(iter(nodes)) if len(nodes) == 1 else "tasks"
    parts = [step, f"{label} {chunk['done']}/{chunk['total']}"]
    if failed:
        parts.append(f"{failed} failed")
    if "queued" in chunk:
        queued, running = _unfinished(chunk["total"] - chunk["done"], chunk)
        workers = chunk.get("workers") or {}
        longest = max((w.get("longest_s", 0) for w in workers.values()), default=0)
        many = "" if len(workers) == 1 else "s"
        where = f" on {len(workers)} worker{many} (longest {longest:.0f}s)" if workers else ""
        parts += [f"{queued} queued", f"{running} running{where}"]
    for late in chunk.get("waiting") or ():
        parts.append(
            f"{late['tasks']} waiting {format_seconds(late['seconds'])} on queue "
            f"{late['queue']!r}: no worker?"
        )
    if len(nodes) > 1:
        parts += [_node_text(name, counts) for name, counts in nodes.items()]
    return " · ".join(parts)


def _unfinished(left: int, counts: dict[str, Any]) -> tuple[int, int]:
    """Queued and running, from a survey that may predate results since: never more than
    the ``left`` tasks not finished."""
    queued = min(counts.get("queued", 0), max(0, left))
    return queued, min(counts.get("running", 0), max(0, left - queued))


def _node_text(name: str, counts: dict[str, Any]) -> str:
    finished = counts.get("done", 0) + counts.get("failed", 0)
    queued, running = _unfinished(counts["total"] - finished, counts)
    states = [
        f"{n} {state}"
        for n, state in (
            (counts.get("failed", 0), "failed"),
            (running, "running"),
            (queued, "queued"),
        )
        if n
    ]
    return f"{name} {finished}/{counts['total']}" + (f" ({', '.join(states)})" if states else "")


def format_seconds(seconds: float) -> str:
    """``7s``, ``2m05s``, ``1h02m``: whole seconds, as a clock that ticks once a second."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)].rstrip() + "…"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False
