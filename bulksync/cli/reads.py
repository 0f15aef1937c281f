"""``bulksync state`` and ``bulksync history``: read a thread, on the cluster or in SQLite.

**On the cluster** (``--graph``), a read is a ``get_state``/``get_state_history`` run that a
coordinator serving the graph answers: building a snapshot (its next tasks, their interrupts)
takes the graph, which the CLI may not be able to import (a module on the workers' path, an
extra not installed here), and a coordinator has it loaded already. Such runs are not the
thread's business: ``bulksync runs`` hides them unless asked (``--reads``), a writer run never
waits for one (``runs_sql.CLAIM_SQL`` only orders writers), and one that gets no answer in time
is cancelled so that it does not linger in the queue.

**In SQLite** (no ``--graph``, or ``--sqlite PATH``), the thread is read in this process from
the file, with the graph of ``--graph`` or else the demo's: ``bulksync state demo-…`` shows a
thread ``bulksync demo`` ran. A thread that has no checkpoint (and no row on the cluster) is
unknown: the command says so and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
from pathlib import Path
from typing import Any, Final, TextIO

from bulksync.cli import positive_int
from bulksync.cli.output import local_time, print_table, snapshot_record, to_json
from bulksync.errors import BulkSyncError, ThreadGraphError, UnservedGraphError, UsageError
from bulksync.settings import Settings

READ_TIMEOUT: Final = 30.0
"""Seconds ``state``/``history`` wait for a coordinator's answer by default."""


def add_parsers(commands: Any) -> None:
    """Register ``state`` and ``history``."""
    state = _thread_command(commands, "state", "show a thread's current state as JSON")
    state.add_argument("--json", action="store_true", help="the state on one line (for scripts)")
    state.set_defaults(run=run_state)
    history = _thread_command(commands, "history", "list a thread's checkpoints, newest first")
    history.add_argument(
        "--limit", type=positive_int, metavar="N", help="at most N checkpoints (default: all)"
    )
    history.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per checkpoint (JSON lines; the fields of `state --json`)",
    )
    history.set_defaults(run=run_history)


def _thread_command(commands: Any, name: str, summary: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}: a thread on the cluster (--graph), "
        "or one in a SQLite file (--sqlite, by default the file `bulksync demo` writes).",
    )
    parser.add_argument("thread", metavar="THREAD", help="the thread id")
    parser.add_argument(
        "--graph",
        metavar="GRAPH_ID",
        help="the thread's graph on the cluster (pkg.module:attr, as the coordinator loaded "
        "it); without it the thread is read from SQLite",
    )
    parser.add_argument(
        "--sqlite",
        type=Path,
        metavar="PATH",
        help="read the thread from this SQLite file, in this process, with --graph's graph "
        "or the demo's (default file: $BULKSYNC_HOME/demo.sqlite)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=READ_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for a coordinator's answer (default: %(default)s)",
    )
    return parser


def run_state(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Print a thread's current state."""
    snapshot = read(args, settings, "get_state", {"subgraphs": False})
    print(to_json(snapshot_record(snapshot), indent=None if args.json else 2), file=out)
    return 0


def run_history(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Print a thread's checkpoints, newest first: a table, or JSON lines."""
    options = {"filter": None, "before": None, "limit": args.limit}
    history = read(args, settings, "get_state_history", options)
    if args.json:
        for snapshot in history:
            print(to_json(snapshot_record(snapshot)), file=out)
        return 0
    rows = [("STEP", "SOURCE", "NEXT", "CREATED", "CHECKPOINT")]
    for snapshot in history:
        record = snapshot_record(snapshot)
        rows.append(
            (
                str(record["step"]),
                str(record["source"]),
                ",".join(record["next"]) or "-",
                _created(record["created_at"]),
                str(record["checkpoint_id"]),
            )
        )
    print_table(rows, out)
    return 0


def read(args: argparse.Namespace, settings: Settings, kind: str, options: dict[str, Any]) -> Any:
    """The ``get_state`` snapshot or the ``get_state_history`` list of the thread.

    Raises:
        UsageError: an unknown thread, a thread of another graph, no coordinator serving
            the graph or no answer in time, a read that failed (one line each).
    """
    if args.graph is None or args.sqlite is not None:
        return _read_sqlite(args, settings, kind, options)
    return _read_cluster(args, settings, kind, options)


def _read_cluster(
    args: argparse.Namespace, settings: Settings, kind: str, options: dict[str, Any]
) -> Any:
    from bulksync.client import Client
    from bulksync.service import submit
    from bulksync.service.threads import ThreadStore

    payload = {"config": submit.run_config(_config(args.thread)), "options": options}
    with Client(settings) as client:
        try:
            run_id = client.create_run(args.graph, kind, payload, thread_id=args.thread)
        except (UnservedGraphError, ThreadGraphError) as exc:
            raise UsageError(str(exc)) from None
        try:
            run = client.wait(run_id, args.timeout)
        except TimeoutError:
            with contextlib.suppress(Exception):  # best effort: it would only answer nobody
                client.cancel(run_id)
            raise UsageError(
                f"no answer within {args.timeout:g} s; is a coordinator serving {args.graph} "
                f"running (bulksync coordinator --graph {args.graph.partition(':')[0]})?"
            ) from None
        error = run.exception()
        if error is not None:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UsageError(f"reading thread '{args.thread}' failed: {first}")
        result = run.output
        if _empty(kind, result) and ThreadStore(client.store.pool).get(args.thread) is None:
            raise UsageError(
                f"no thread '{args.thread}' in this database (no checkpoint, no run); check "
                "the id (bulksync runs lists recent runs with their threads) and "
                "BULKSYNC_DATABASE_URL"
            )
    return result


def _read_sqlite(
    args: argparse.Namespace, settings: Settings, kind: str, options: dict[str, Any]
) -> Any:
    import sqlite3

    from bulksync.checkpoint.sqlite import SqliteSaver
    from bulksync.cli.demo import is_sqlite_or_empty

    db = (args.sqlite or settings.demo_db).expanduser().absolute()
    where = f"SQLite file {db}" if args.sqlite else f"the demo's SQLite file ({db})"
    hint = "" if args.sqlite else "; for a thread on the cluster pass --graph GRAPH_ID"
    if not db.is_file():
        raise UsageError(f"no thread '{args.thread}': {where} does not exist{hint}")
    if not is_sqlite_or_empty(db):
        raise UsageError(f"{db} is not a SQLite database; pass --sqlite with a checkpoint file")
    graph = _local_graph(args.graph)
    config = _config(args.thread)
    try:
        with SqliteSaver.from_conn_string(str(db)) as saver:
            if saver.get_tuple(config) is None:
                raise UsageError(f"no thread '{args.thread}' in {where}{hint}")
            bound = graph.with_checkpointer(saver)
            if kind == "get_state":
                return bound.get_state(config, **options)
            return list(bound.get_state_history(config, **options))
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read {db} as a checkpoint file ({exc})") from None
    except BulkSyncError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"reading thread '{args.thread}' failed: {exc}") from None


def _local_graph(ref: str | None) -> Any:
    """The graph that reads a SQLite thread: ``ref``'s (imported here), or the demo's."""
    if ref is None:
        from bulksync.demo import build_demo_graph

        return build_demo_graph().compile()
    from bulksync.cli.worker import load_registry

    registry = load_registry([ref])
    ids = list(registry.ids())
    if len(ids) != 1:
        raise UsageError(f"--graph {ref} loads {len(ids)} graphs; name one as pkg.module:attr")
    return registry.get(ids[0])


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _empty(kind: str, result: Any) -> bool:
    if kind == "get_state":
        return bool(result.config.get("configurable", {}).get("checkpoint_id") is None)
    return not result


def _created(value: Any) -> str:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return local_time(datetime.datetime.fromisoformat(value))
    return "" if value is None else str(value)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value
