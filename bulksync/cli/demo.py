"""``bulksync demo``: the map-reduce example in-process, checkpointing to SQLite."""

from __future__ import annotations

import argparse
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any, Final, TextIO

from bulksync.cli import positive_int
from bulksync.errors import UsageError
from bulksync.settings import Settings

# Printing 10,000 jokes helps nobody; the count and the best one tell the story.
MAX_JOKES_SHOWN: Final = 10
SQLITE_MAGIC: Final = b"SQLite format 3\x00"


def add_parser(commands: Any) -> None:
    """Register ``demo``."""
    demo = commands.add_parser(
        "demo",
        help="run the map-reduce example in-process, checkpointing to SQLite",
        description=(
            "Run the map-reduce example graph in-process: one task splits a topic list, "
            "Send fans out one 'generate' task per subject, 'summarize' reduces. Checkpoints "
            "go to a SQLite file; no services are needed."
        ),
    )
    demo.add_argument(
        "--fanout",
        type=positive_int,
        default=5,
        metavar="N",
        help="number of parallel 'generate' tasks (default: %(default)s)",
    )
    demo.add_argument(
        "--db",
        type=Path,
        metavar="PATH",
        help="SQLite file for the checkpoints (default: $BULKSYNC_HOME/demo.sqlite)",
    )
    demo.add_argument(
        "--thread-id",
        metavar="ID",
        help="thread to run on (default: a new thread each run)",
    )
    demo.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """``bulksync demo``: run the map-reduce graph with a SQLite checkpointer and report."""
    db = (args.db or settings.demo_db).expanduser().absolute()
    prepare_db_path(db)
    thread_id: str = args.thread_id or f"demo-{uuid.uuid4().hex[:12]}"
    try:
        result, checkpoints = run_map_reduce(db, args.fanout, thread_id)
    except sqlite3.Error as exc:
        raise UsageError(
            f"cannot use {db} as a SQLite database ({exc}); pass --db with a new file path"
        ) from exc
    report_demo(out, result, db=db, thread_id=thread_id, checkpoints=checkpoints)
    return 0


def run_map_reduce(db: Path, fanout: int, thread_id: str) -> tuple[dict[str, Any], int]:
    """Run the demo graph on thread ``thread_id``; return the final state and checkpoint count."""
    # Imported here so that `bulksync --help` and the argument checks work without the engine.
    from bulksync.checkpoint.sqlite import SqliteSaver
    from bulksync.demo import build_demo_graph, demo_input

    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    with SqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_demo_graph().compile(checkpointer=saver)
        result: dict[str, Any] = graph.invoke(demo_input(fanout), config=config)
        checkpoints = sum(1 for _ in graph.get_state_history(config))
    return result, checkpoints


def report_demo(
    out: TextIO, result: dict[str, Any], *, db: Path, thread_id: str, checkpoints: int
) -> None:
    """Print the demo's outcome and where its checkpoints are."""
    jokes: list[str] = result.get("jokes", [])
    print(f"Map-reduce demo: {len(jokes)} 'generate' tasks fanned out by Send.", file=out)
    for joke in jokes[:MAX_JOKES_SHOWN]:
        print(f"  - {joke}", file=out)
    if len(jokes) > MAX_JOKES_SHOWN:
        print(f"  … and {len(jokes) - MAX_JOKES_SHOWN} more", file=out)
    print(f"Best joke: {result.get('best_joke', '')}", file=out)
    print(f"Thread: {thread_id}", file=out)
    print(f"Checkpoints: {checkpoints} (SQLite file: {db})", file=out)
    print(f"Inspect it: bulksync state {thread_id} · bulksync history {thread_id}", file=out)


def prepare_db_path(db: Path) -> None:
    """Create ``db``'s directory and check that a SQLite file can live at ``db``.

    Raises:
        UsageError: naming the path and what to pass instead.
    """
    hint = "pass --db with a file path in a writable directory, or set BULKSYNC_HOME"
    if db.is_dir():
        raise UsageError(f"{db} is a directory; pass a file path such as {db / 'demo.sqlite'}")
    blocker = next((p for p in db.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"{blocker} is a file, so {db} cannot be created in it; {hint}")
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"cannot create directory {db.parent} ({reason}); {hint}") from exc
    # Root passes any access check, so this only catches what an ordinary user would hit.
    if not os.access(db.parent, os.W_OK | os.X_OK):
        raise UsageError(f"directory {db.parent} is not writable; {hint}")
    if not is_sqlite_or_empty(db):
        raise UsageError(
            f"{db} exists and is not a SQLite database; pass --db with a new file path "
            "(bulksync never overwrites a file it did not create)"
        )


def is_sqlite_or_empty(path: Path) -> bool:
    """Whether ``path`` is missing, empty, or starts with SQLite's file header."""
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return True
    except OSError as exc:
        raise UsageError(
            f"cannot read {path} ({exc.strerror}); pass --db with another path"
        ) from exc
    return head in (b"", SQLITE_MAGIC)
