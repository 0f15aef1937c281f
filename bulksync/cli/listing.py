"""``bulksync runs`` (recent runs) and ``bulksync cancel`` (stop one)."""

from __future__ import annotations

import argparse
from typing import Any, Final, TextIO

from bulksync.cli import positive_int
from bulksync.cli.output import local_time, print_table, run_record, to_json
from bulksync.errors import UsageError
from bulksync.settings import Settings

# Spelled out so that building the parser imports no service code (a test keeps it in step).
STATUSES: Final = ("pending", "running", "interrupted", "success", "error", "cancelled", "timeout")
FINISHED: Final = frozenset(STATUSES[2:])
WRITER_KINDS: Final = ("invoke", "stream", "update_state")
"""The kinds ``runs`` lists by default: reads (``state``, ``history``) are not the thread's
runs, only questions a coordinator answered (``--reads`` shows them too)."""


def add_parsers(commands: Any) -> None:
    """Register ``runs`` and ``cancel``."""
    listing = commands.add_parser(
        "runs",
        help="list recent runs",
        description="List runs, newest first. Reads of a thread's state (get_state, "
        "get_state_history) are left out unless --reads is given.",
    )
    listing.add_argument("--thread", metavar="ID", help="only the runs of this thread")
    listing.add_argument("--status", choices=STATUSES, help="only runs with this status")
    listing.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="at most N (default: 20)"
    )
    listing.add_argument("--reads", action="store_true", help="list state and history reads too")
    listing.add_argument(
        "--json",
        action="store_true",
        help="one JSON array of run records (run_id, thread_id, graph_id, kind, status, "
        "error, created_at, updated_at)",
    )
    listing.set_defaults(run=run_runs)

    cancel = commands.add_parser(
        "cancel",
        help="cancel a run",
        description="Cancel RUN_ID: a pending run at once, a running one as soon as its "
        "in-flight tasks are revoked (no later writes are applied). A finished run is left "
        "as it is.",
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.add_argument(
        "--json",
        action="store_true",
        help="print {run_id, status, cancelled, already_finished} as JSON",
    )
    cancel.set_defaults(run=run_cancel)


def run_runs(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Print recent runs: a table, or a JSON array."""
    from bulksync.client import Client

    kinds = None if args.reads else WRITER_KINDS
    with Client(settings) as client:
        found = client.list_runs(
            thread_id=args.thread, status=args.status, limit=args.limit, kinds=kinds
        )
    if args.json:
        print(to_json([run_record(run, output=False) for run in found]), file=out)
        return 0
    rows = [("RUN", "STATUS", "KIND", "GRAPH", "THREAD", "CREATED", "ERROR")]
    for run in found:
        error = (run.error or "").splitlines()[0][:60] if run.error else ""
        created = local_time(run.created_at)
        rows.append((run.run_id, run.status, run.kind, run.graph_id, run.thread_id, created, error))
    print_table(rows, out)
    return 0


def run_cancel(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Cancel a run and say what became of it; a finished run is only reported."""
    from bulksync.client import Client

    with Client(settings) as client:
        try:
            before = client.get(args.run_id)
            run = before if before.status in FINISHED else client.cancel(args.run_id)
        except LookupError as exc:
            raise UsageError(str(exc)) from None
    # Finished before the request: found so, or finished (not by it) while it was made.
    already = before.status in FINISHED or run.status not in ("cancelled", "running")
    if args.json:
        record = {
            "run_id": run.run_id,
            "status": run.status,
            "cancelled": not already,
            "already_finished": already,
        }
        print(to_json(record), file=out)
    elif already:
        print(f"{run.run_id}: already finished ({run.status}); nothing to cancel", file=out)
    elif run.status == "running":
        print(f"{run.run_id}: running; cancel requested, its tasks are being revoked", file=out)
    else:
        print(f"{run.run_id}: {run.status}", file=out)
    return 0
