"""Following a run to its end: ``bulksync follow``, and ``submit --wait``/``resume --wait``.

The run's progress goes to stderr (``progress.ProgressLine``), its output to stdout. A run
that pauses on ``interrupt()`` is told with its thread, the interrupt values and the
``bulksync resume`` command that answers it. Ctrl-C stops the watching, not the run: the
command says so, with the commands that watch it again or cancel it, and exits 130.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Final, TextIO

from bulksync.cli.output import interrupts_of, run_record, to_json
from bulksync.cli.progress import ProgressLine
from bulksync.errors import UsageError
from bulksync.service import events
from bulksync.settings import Settings

TICK: Final = 1.0
"""Longest wait for an event before the progress line is redrawn (its clock moves)."""
FAILED: Final = ("error", "cancelled", "timeout")  # runs.FAILED, without importing the service


def add_parser(commands: Any) -> None:
    """Register ``follow``."""
    parser = commands.add_parser(
        "follow",
        help="watch a run: its progress, then its output",
        description="Attach to RUN_ID's event stream, from its start or after --after, and "
        "show its progress, then its output as `submit --wait` does. Ctrl-C stops watching; "
        "the run goes on.",
    )
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument(
        "--after",
        metavar="EVENT_ID",
        default="0",
        help="only the events after this one (ids are in `follow --json`'s lines)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print every event as a JSON line {id, namespace, mode, data}; the last one, "
        "mode 'end', has the run's final record as data",
    )
    parser.set_defaults(run=run_follow)


def run_follow(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Follow a run (queued by anyone) to its end."""
    import sys

    from bulksync.client import Client

    with Client(settings) as client:
        try:
            client.get(args.run_id)
        except LookupError as exc:
            raise UsageError(str(exc)) from None
        output = "events" if args.json else "human"
        return follow(client, args.run_id, out, sys.stderr, after=args.after, output=output)


def follow(
    client: Any,
    run_id: str,
    out: TextIO,
    err: TextIO,
    *,
    after: str = "0",
    output: str = "human",
) -> int:
    """Show a run's progress on ``err`` until it ends, then its output on ``out``.

    ``output``: ``human`` (the output as indented JSON), ``record`` (the final record, one
    JSON document) or ``events`` (each event a JSON line, the final record in the last).
    Returns 0 when the run succeeded or paused on an interrupt, 1 when it failed, 130 when
    Ctrl-C stopped the watching.
    """
    from bulksync.cli import EXIT_INTERRUPTED
    from bulksync.service import runs

    last_id = after
    line: ProgressLine | None = None
    try:
        run = client.get(run_id)
        print(f"run {run_id} · thread {run.thread_id} · graph {run.graph_id}", file=err)
        line = ProgressLine(err, run.graph_id)
        line.status = run.status if run.status == runs.PENDING else runs.RUNNING
        line.draw()
        for event in client.watch(run_id, after, tick=TICK):
            if event is None:
                if line.pending:  # one row read a tick, only until a coordinator takes it
                    line.set_status(client.get(run_id).status)
                line.tick()
                continue
            last_id = event.id
            if event.mode == events.END:
                break
            if output == "events":
                print(to_json(_event_line(event, event.chunk)), file=out, flush=True)
            if event.mode == events.PROGRESS:
                line.progress(event.chunk)
            elif line.pending:  # any event is written by the coordinator driving the run
                line.set_status(runs.RUNNING)
        run = client.get(run_id)
        line.finish(run.status)
    except KeyboardInterrupt:
        if line is not None:
            line.close()
        print(
            f"bulksync: stopped watching; run {run_id} goes on.\n"
            f"  watch it again: bulksync follow {run_id}\n"
            f"  stop it:        bulksync cancel {run_id}",
            file=err,
        )
        return EXIT_INTERRUPTED
    return _report(run, out, err, output, last_id)


def _report(run: Any, out: TextIO, err: TextIO, output: str, last_id: str) -> int:
    if output == "events":
        end = _event_line(None, run_record(run), last_id)
        print(to_json(end), file=out, flush=True)
    elif output == "record":
        print(to_json(run_record(run)), file=out)
    failed = run.status in FAILED
    if failed:
        print(f"bulksync: run {run.run_id} ended with status {run.status}: {run.error}", file=err)
    elif output == "human":
        print(to_json(run.output, indent=2), file=out)
    if run.status == "interrupted":
        out.flush()  # the output first, then how to answer it
        print("\n".join(resume_hint(run)), file=err)
    return 1 if failed else 0


def _event_line(event: Any, data: Any, end_id: str | None = None) -> dict[str, Any]:
    if event is None:
        return {"id": end_id, "namespace": [], "mode": "end", "data": data}
    return {"id": event.id, "namespace": list(event.namespace), "mode": event.mode, "data": data}


def resume_hint(run: Any) -> list[str]:
    """The lines that tell how to answer an interrupted run: its thread, the interrupt
    values, and the ``bulksync resume`` command (a placeholder for the answer)."""
    thread, graph = shlex.quote(run.thread_id), shlex.quote(run.graph_id)
    found = interrupts_of(run)
    if not found:  # a breakpoint (interrupt_before/after): no question, just continue
        return [
            f"run {run.run_id} paused at a breakpoint on thread {run.thread_id}; continue it:",
            f"  bulksync submit {graph} --thread {thread} --input null --wait",
        ]
    lines = [f"run {run.run_id} waits for an answer on thread {run.thread_id}:"]
    if len(found) == 1:
        lines.append(f"  {to_json(found[0].value)}")
        value = "'<JSON>'"
    else:  # several at once: each answer under its interrupt's id
        lines += [f"  {i.id}: {to_json(i.value)}" for i in found]
        value = "'{" + ", ".join(f'"{i.id}": <JSON>' for i in found) + "}'"
    lines.append("answer it (replace <JSON> with the answer as JSON):")
    lines.append(f"  bulksync resume {thread} --graph {graph} --value {value} --wait")
    return lines
