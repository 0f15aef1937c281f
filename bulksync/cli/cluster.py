"""The commands that drive runs on the cluster: coordinator, submit, runs, state, …

``coordinator`` is the service (``bulksync.service.coordinator``); the others are clients
(``bulksync.client``) and need a coordinator serving the graph to get an answer. Values on
the command line and in the output are JSON; types JSON lacks are shown as their ``repr``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from bulksync.cli import positive_int
from bulksync.cli.setting_flags import add_setting_flags
from bulksync.cli.worker import (
    add_graph_option,
    announcer,
    check_broker,
    check_redis,
    load_registry,
)
from bulksync.coordinator.stream import ALL_MODES
from bulksync.errors import BulkSyncError, ThreadBusyError, UnservedGraphError, UsageError
from bulksync.logs import configure as configure_logging
from bulksync.settings import Settings

# Spelled out so that building the parser imports no service code (a test keeps it in step).
STATUSES = ("pending", "running", "interrupted", "success", "error", "cancelled", "timeout")
READ_TIMEOUT = 30.0
"""Seconds ``state``/``history`` wait for a coordinator's answer by default."""


def add_parsers(commands: Any) -> None:
    """Register the run commands."""
    _coordinator(commands)
    submit = commands.add_parser(
        "submit",
        help="submit a run of a graph to the cluster",
        description="Queue a run of GRAPH_ID (pkg.module:attr, as the coordinator loaded it) "
        "and print its id; with --wait, show its progress and print its output as JSON.",
    )
    submit.add_argument("graph_id", metavar="GRAPH_ID", help="the graph, e.g. bulksync.demo:graph")
    submit.add_argument("--input", required=True, metavar="JSON", help="the run's input, as JSON")
    submit.add_argument("--thread", metavar="ID", help="thread to run on (default: a new one)")
    submit.add_argument(
        "--stream-mode",
        choices=ALL_MODES,
        default="values",
        help="events the run streams for `bulksync`'s clients (default: %(default)s)",
    )
    _add_strategy(submit)
    submit.add_argument("--wait", action="store_true", help="wait for the run and print its output")
    submit.set_defaults(run=run_submit)

    listing = commands.add_parser(
        "runs", help="list recent runs", description="List runs, newest first."
    )
    listing.add_argument("--thread", metavar="ID", help="only the runs of this thread")
    listing.add_argument("--status", choices=STATUSES, help="only runs with this status")
    listing.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="at most N (default: 20)"
    )
    listing.set_defaults(run=run_runs)

    state = _thread_command(commands, "state", "show a thread's current state as JSON")
    state.set_defaults(run=run_state)
    history = _thread_command(commands, "history", "list a thread's checkpoints, newest first")
    history.add_argument(
        "--limit", type=positive_int, metavar="N", help="at most N checkpoints (default: all)"
    )
    history.set_defaults(run=run_history)

    resume = commands.add_parser(
        "resume",
        help="answer a thread's pending interrupt",
        description="Submit Command(resume=VALUE) on THREAD: the interrupted node runs again "
        "and its interrupt() returns VALUE.",
    )
    resume.add_argument("thread", metavar="THREAD", help="the interrupted thread")
    _add_graph_id(resume)
    resume.add_argument("--value", required=True, metavar="JSON", help="the answer, as JSON")
    _add_strategy(resume)
    resume.add_argument("--wait", action="store_true", help="wait for the run and print its output")
    resume.set_defaults(run=run_resume)

    cancel = commands.add_parser(
        "cancel",
        help="cancel a run",
        description="Cancel RUN_ID: a pending run at once, a running one as soon as its "
        "in-flight tasks are revoked (no later writes are applied).",
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.set_defaults(run=run_cancel)


def _coordinator(commands: Any) -> None:
    parser = commands.add_parser(
        "coordinator",
        help="run the coordinator service: drive submitted runs on the workers",
        description="Claim runs of the graphs named by --graph from Postgres, drive each on "
        "the Celery workers, stream their events to Redis, and take over the runs of "
        "coordinators that stopped heartbeating. Start several for availability.",
    )
    add_graph_option(parser)
    add_setting_flags(parser, "coordinator")  # --max-runs, --heartbeat, …
    parser.add_argument(
        "--loglevel",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: %(default)s)",
    )
    parser.set_defaults(run=run_coordinator)


def _thread_command(commands: Any, name: str, summary: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=summary, description=summary)
    parser.add_argument("thread", metavar="THREAD", help="the thread id")
    _add_graph_id(parser)
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=READ_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for a coordinator's answer (default: %(default)s)",
    )
    return parser


def _add_graph_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--graph",
        required=True,
        metavar="GRAPH_ID",
        help="the thread's graph (pkg.module:attr, as the coordinator loaded it)",
    )


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


# -- commands ---------------------------------------------------------------------------------


def run_coordinator(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Serve runs until interrupted."""
    from bulksync.service.coordinator import open_coordinator
    from bulksync.workers.celery.app import make_app

    configure_logging(settings.log_format, args.loglevel)
    registry = load_registry(args.graph)
    check_redis(settings.redis_url)
    app = make_app(settings)
    check_broker(app, settings.broker_url)
    with open_coordinator(settings, registry, app=app) as coordinator:
        say = announcer(out, settings.log_format == "json")
        say(f"bulksync coordinator: graphs {', '.join(registry.ids())}")
        say(f"bulksync coordinator: {coordinator.owner}, up to {settings.max_runs} runs at once")
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (docker stop, kubectl): finish the runs in flight, then exit.
            stop = threading.Thread(target=coordinator.stop, daemon=True)

            def on_term(*_: Any) -> None:
                if stop.ident is None:  # a second SIGTERM changes nothing
                    stop.start()

            signal.signal(signal.SIGTERM, on_term)
        coordinator.serve()
    return 0


def run_submit(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Submit a run; with --wait, follow it to its end."""
    value = _json_arg("--input", args.input)
    return _submit(args, settings, out, args.graph_id, value, args.thread, args.stream_mode)


def run_resume(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Submit ``Command(resume=value)`` on a thread; with --wait, follow it to its end."""
    from bulksync.types import Command

    value: Command[Any] = Command(resume=_json_arg("--value", args.value))
    return _submit(args, settings, out, args.graph, value, args.thread, "values")


def run_runs(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Print recent runs as a table."""
    with _client(settings) as client:
        found = client.list_runs(thread_id=args.thread, status=args.status, limit=args.limit)
    rows = [("RUN", "STATUS", "KIND", "GRAPH", "THREAD", "CREATED", "ERROR")]
    for run in found:
        created = run.created_at.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        error = (run.error or "").splitlines()[0][:60] if run.error else ""
        rows.append((run.run_id, run.status, run.kind, run.graph_id, run.thread_id, created, error))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
    return 0


def run_state(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Print a thread's current state."""
    snapshot = _remote(settings, args, lambda g, c: g.get_state(c))
    print(to_json(_snapshot(snapshot), indent=2), file=out)
    return 0


def run_history(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Print a thread's checkpoints, one JSON object per line."""
    history = _remote(settings, args, lambda g, c: list(g.get_state_history(c, limit=args.limit)))
    for snapshot in history:
        metadata = snapshot.metadata or {}
        line = {
            "checkpoint_id": snapshot.config["configurable"].get("checkpoint_id"),
            "step": metadata.get("step"),
            "source": metadata.get("source"),
            "next": snapshot.next,
            "values": snapshot.values,
        }
        print(to_json(line), file=out)
    return 0


def run_cancel(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Cancel a run and print its status."""
    with _client(settings) as client:
        try:
            run = client.cancel(args.run_id)
        except LookupError as exc:
            raise UsageError(str(exc)) from None
    note = " (cancel requested; its tasks are being revoked)" if run.status == "running" else ""
    print(f"{run.run_id}: {run.status}{note}", file=out)
    return 0


# -- helpers ----------------------------------------------------------------------------------


def _submit(
    args: argparse.Namespace,
    settings: Settings,
    out: TextIO,
    graph_id: str,
    value: Any,
    thread: str | None,
    stream_mode: str,
) -> int:
    with _client(settings) as client:
        try:
            run_id = client.submit(
                graph_id,
                value,
                thread_id=thread,
                stream_mode=stream_mode,
                multitask_strategy=args.multitask_strategy,
                require_coordinator=not args.queue_anyway,
            )
        except (ThreadBusyError, UnservedGraphError) as exc:
            raise UsageError(str(exc)) from None
        if not args.wait:
            print(run_id, file=out)
            return 0
        return follow(client, run_id, out, sys.stderr)


def follow(client: Any, run_id: str, out: TextIO, err: TextIO) -> int:
    """Show a run's progress on one line of ``err``; print its output (JSON) on ``out``.

    Returns 0 when the run succeeded or paused on an interrupt, 1 when it failed.
    """
    from bulksync.service import runs

    started = time.monotonic()
    width = 0

    def show(text: str) -> None:
        nonlocal width
        line = f"run {run_id}: {text} · {time.monotonic() - started:.1f}s"
        err.write("\r" + line.ljust(width))
        err.flush()
        width = len(line)

    show(f"waiting for a coordinator serving {client.get(run_id).graph_id}")
    for event in client.stream(run_id):
        if event.mode == runs.PROGRESS:
            show(progress_text(event.chunk))
        elif event.mode == runs.END:
            show(str(event.chunk["status"]))
    err.write("\n")
    run = client.get(run_id)
    if run.status in runs.FAILED:
        print(f"bulksync: run {run_id} ended with status {run.status}: {run.error}", file=err)
        return 1
    print(to_json(run.output, indent=2), file=out)
    return 0


def progress_text(chunk: dict[str, Any]) -> str:
    """One progress event as the progress line shows it: the step's tasks done, and where
    the others are once the coordinator has looked (queued, running on how many workers,
    queues nobody takes from)."""
    parts = [f"step {chunk['step']}", f"tasks {chunk['done']}/{chunk['total']}"]
    if "queued" in chunk:
        workers = chunk.get("workers") or {}
        longest = max((w.get("longest_s", 0) for w in workers.values()), default=0)
        parts.append(f"{chunk['queued']} queued")
        parts.append(
            f"{chunk['running']} running on {len(workers)} workers (longest {longest:.0f}s)"
        )
    for late in chunk.get("waiting") or ():
        parts.append(
            f"{late['tasks']} waiting {late['seconds']:.0f}s on queue {late['queue']!r}: "
            "is a worker consuming it?"
        )
    return " · ".join(parts)


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


def _snapshot(snapshot: Any) -> dict[str, Any]:
    return {
        "values": snapshot.values,
        "next": snapshot.next,
        "tasks": [
            {"id": t.id, "name": t.name, "interrupts": t.interrupts, "error": t.error}
            for t in snapshot.tasks
        ],
        "interrupts": snapshot.interrupts,
        "config": snapshot.config,
        "metadata": snapshot.metadata,
        "created_at": snapshot.created_at,
        "parent_config": snapshot.parent_config,
    }


def _remote(settings: Settings, args: argparse.Namespace, call: Callable[[Any, Any], Any]) -> Any:
    from bulksync.client import RemoteGraph

    config = {"configurable": {"thread_id": args.thread}}
    with _client(settings) as client:
        graph = RemoteGraph(args.graph, client, timeout=args.timeout)
        try:
            return call(graph, config)
        except (BulkSyncError, ValueError) as exc:  # the run failed: say why in one line
            raise UsageError(str(exc).splitlines()[0]) from None
        except TimeoutError:
            raise UsageError(
                f"no answer within {args.timeout:g} s; is a coordinator serving {args.graph} "
                f"running (bulksync coordinator --graph {args.graph.partition(':')[0]})?"
            ) from None


def _client(settings: Settings) -> Any:
    """A client; it reports an unreachable service (one line) when it first needs it."""
    from bulksync.client import Client

    return Client(settings)


def _json_arg(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{option} is not valid JSON ({exc}); e.g. {option} '{{\"n\": 1}}'"
        ) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value
