"""``bulksync submit`` and ``bulksync resume``: queue a run, and with ``--wait`` follow it.

Without ``--wait`` the run's id is printed (``--json``: ``{"run_id", "thread_id"}``) and
stderr says how to follow it; with ``--wait`` the command ends with the run
(``follow.follow``): its output on stdout (``--json``: its final record), exit 1 if it failed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from bulksync.cli.follow import follow
from bulksync.cli.inputs import add_run_options, json_option, one_stdin, run_config
from bulksync.cli.output import to_json
from bulksync.errors import ThreadBusyError, ThreadGraphError, UnservedGraphError, UsageError
from bulksync.settings import Settings


def add_parsers(commands: Any) -> None:
    """Register ``submit`` and ``resume``."""
    from bulksync.coordinator.stream import ALL_MODES

    submit = commands.add_parser(
        "submit",
        help="submit a run of a graph to the cluster",
        description="Queue a run of GRAPH_ID (pkg.module:attr, as the coordinator loaded it) "
        "and print its id; with --wait, show its progress and print its output as JSON.",
    )
    submit.add_argument("graph_id", metavar="GRAPH_ID", help="the graph, e.g. bulksync.demo:graph")
    submit.add_argument(
        "--input",
        required=True,
        metavar="JSON",
        help="the run's input: JSON, @FILE (a JSON file) or - (read stdin)",
    )
    submit.add_argument("--thread", metavar="ID", help="thread to run on (default: a new one)")
    submit.add_argument(
        "--stream-mode",
        choices=ALL_MODES,
        default="values",
        help="events the run streams for `bulksync`'s clients (default: %(default)s)",
    )
    add_run_options(submit)
    _add_strategy(submit)
    _add_wait(submit)
    submit.set_defaults(run=run_submit)

    resume = commands.add_parser(
        "resume",
        help="answer a thread's pending interrupt",
        description="Submit Command(resume=VALUE) on THREAD: the interrupted node runs again "
        "and its interrupt() returns VALUE.",
    )
    resume.add_argument("thread", metavar="THREAD", help="the interrupted thread")
    resume.add_argument(
        "--graph",
        required=True,
        metavar="GRAPH_ID",
        help="the thread's graph (pkg.module:attr, as the coordinator loaded it)",
    )
    resume.add_argument(
        "--value",
        required=True,
        metavar="JSON",
        help="the answer: JSON, @FILE or - (stdin); several interrupts at once: an object "
        "mapping each interrupt id to its answer",
    )
    add_run_options(resume)
    _add_strategy(resume)
    _add_wait(resume)
    resume.set_defaults(run=run_resume)


def _add_strategy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--multitask-strategy",
        choices=("enqueue", "reject"),
        default="enqueue",
        help="when the thread already has an active run: queue behind it, or refuse "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--queue-anyway",
        action="store_true",
        help="queue the run even if no coordinator serves the graph yet (default: refuse)",
    )


def _add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="wait for the run and print its output")
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"run_id", "thread_id"} as JSON; with --wait, the final run record '
        "(run_id, thread_id, graph_id, kind, status, error, output, interrupts, times)",
    )


def run_submit(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Submit a run; with --wait, follow it to its end."""
    one_stdin(**{"--input": args.input, "--config": args.config})
    value = json_option("--input", args.input)
    config = run_config(args.config, args.recursion_limit)
    return _submit(args, settings, out, args.graph_id, value, config, args.stream_mode)


def run_resume(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Submit ``Command(resume=value)`` on a thread; with --wait, follow it to its end."""
    from bulksync.types import Command

    one_stdin(**{"--value": args.value, "--config": args.config})
    value: Command[Any] = Command(resume=json_option("--value", args.value))
    config = run_config(args.config, args.recursion_limit)
    return _submit(args, settings, out, args.graph, value, config, "values")


def _submit(
    args: argparse.Namespace,
    settings: Settings,
    out: TextIO,
    graph_id: str,
    value: Any,
    config: dict[str, Any] | None,
    stream_mode: str,
) -> int:
    from bulksync.client import Client

    with Client(settings) as client:
        try:
            run_id = client.submit(
                graph_id,
                value,
                thread_id=args.thread,
                config=config,
                stream_mode=stream_mode,
                multitask_strategy=args.multitask_strategy,
                require_coordinator=not args.queue_anyway,
            )
        except (ThreadBusyError, UnservedGraphError, ThreadGraphError) as exc:
            raise UsageError(str(exc)) from None
        if args.wait:
            output = "record" if args.json else "human"
            return follow(client, run_id, out, sys.stderr, output=output)
        thread = client.get(run_id).thread_id
    if args.json:
        print(to_json({"run_id": run_id, "thread_id": thread}), file=out)
    else:
        print(run_id, file=out)
        print(f"queued on thread {thread}; watch it: bulksync follow {run_id}", file=sys.stderr)
    return 0
