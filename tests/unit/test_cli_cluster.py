"""The run commands' command lines: help, parsing, JSON output, one-line errors (no services).

Their runs against a real coordinator are in ``tests/integration/test_service.py``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json

import pytest

from bulksync.cli import build_parser, main
from bulksync.cli.cluster import STATUSES, to_json
from bulksync.coordinator.stream import ALL_MODES
from bulksync.service import runs
from bulksync.types import Interrupt

RUN_OPTIONS = ["--config", "--recursion-limit", "--wait", "--json"]
COMMANDS = {
    "coordinator": ["--graph", "--max-runs", "--heartbeat"],
    "submit": ["GRAPH_ID", "--input", "--thread", "--stream-mode", *RUN_OPTIONS],
    "follow": ["RUN_ID", "--after", "--json"],
    "runs": ["--thread", "--status", "--limit", "--reads", "--json"],
    "state": ["THREAD", "--graph", "--sqlite", "--json"],
    "history": ["THREAD", "--graph", "--sqlite", "--limit", "--json"],
    "resume": ["THREAD", "--graph", "--value", *RUN_OPTIONS],
    "cancel": ["RUN_ID", "--json"],
}
NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1: refused at once
NO_POSTGRES = "postgresql://u:secret@127.0.0.1:1/db"


@pytest.fixture(autouse=True)
def _unreachable_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every service URL points where nothing answers, so no test here reaches a real one."""
    monkeypatch.setenv("BULKSYNC_REDIS_URL", NO_REDIS)
    monkeypatch.setenv("BULKSYNC_BROKER_URL", NO_REDIS)
    monkeypatch.setenv("BULKSYNC_DATABASE_URL", NO_POSTGRES)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("command", "options"), COMMANDS.items(), ids=list(COMMANDS))
def test_help_lists_the_options(
    command: str, options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: bulksync {command}")
    for option in options:
        assert option in out


def test_the_commands_compose_runs_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["coordinator", "--graph", "bulksync.demo"])
    assert (args.graph, args.max_runs, args.heartbeat) == (["bulksync.demo"], 100, 5.0)
    args = parser.parse_args(
        ["submit", "bulksync.demo:graph", "--input", '{"topics": ["cats"], "fanout": 4}', "--wait"]
    )
    assert (args.graph_id, args.wait, args.stream_mode, args.thread) == (
        "bulksync.demo:graph",
        True,
        "values",
        None,
    )


def stream_mode_choices() -> tuple[str, ...]:
    """The choices ``bulksync submit --stream-mode`` offers, read from the built parser."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    option = next(a for a in commands.choices["submit"]._actions if a.dest == "stream_mode")
    return tuple(option.choices or ())


def test_choices_follow_the_library() -> None:
    from bulksync.cli import follow, listing

    assert stream_mode_choices() == ALL_MODES
    assert STATUSES == runs.STATUSES
    assert listing.FINISHED == runs.FINISHED and set(follow.FAILED) == runs.FAILED
    assert set(listing.WRITER_KINDS) == set(runs.KINDS) - set(runs.READ_KINDS)


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "g:graph", "--input", "{}"],
        ["runs"],
        ["state", "t1", "--graph", "g:graph"],
        ["history", "t1", "--graph", "g:graph"],
        ["resume", "t1", "--graph", "g:graph", "--value", '"yes"'],
        ["cancel", "some-run"],
        ["follow", "some-run"],
    ],
    ids=lambda argv: argv[0],
)
def test_unreachable_postgres_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    line = error_line(capsys)
    assert line.startswith(f"bulksync {argv[0]}: error: Cannot connect to Postgres at ")
    assert "postgresql://u:***@127.0.0.1:1/db" in line and "secret" not in line
    assert "BULKSYNC_DATABASE_URL" in line


def test_coordinator_with_unreachable_redis_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coordinator", "--graph", "bulksync.demo"]) == 2
    line = error_line(capsys)
    assert line.startswith(f"bulksync coordinator: error: cannot reach Redis at {NO_REDIS}")
    assert "BULKSYNC_REDIS_URL" in line


def test_coordinator_with_an_unknown_graph_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coordinator", "--graph", "bulksync.no_such_module"]) == 2
    assert "cannot import module 'bulksync.no_such_module'" in error_line(capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "g:graph", "--input", "{bad"], "--input is not valid JSON"),
        (["resume", "t", "--graph", "g:graph", "--value", "yes"], "--value is not valid JSON"),
    ],
)
def test_bad_json_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in error_line(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--status", "finished"],
        ["runs", "--limit", "0"],
        ["coordinator", "--graph", "bulksync.demo", "--heartbeat", "0"],
        ["submit", "g:graph", "--input", "{}", "--stream-mode", "loud"],
        ["submit", "g:graph", "--input", "{}", "--recursion-limit", "0"],
        ["resume", "t1", "--value", "1"],  # --graph is required
    ],
    ids=" ".join,
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_to_json_shows_what_json_lacks() -> None:
    value = {
        "interrupt": Interrupt("why?", "i1"),
        "pair": (1, 2),
        "tags": {"b", "a"},
        "at": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "other": object,
    }
    assert json.loads(to_json(value)) == {
        "interrupt": {"value": "why?", "id": "i1", "response_schema": None},
        "pair": [1, 2],
        "tags": ["a", "b"],
        "at": "2024-01-02T03:04:05",
        "other": "<class 'object'>",
    }


def test_a_worker_collects_its_oldest_garbage_after_the_collections_set() -> None:
    from bulksync.cli.worker import tune_gc
    from bulksync.settings import Settings

    kept = gc.get_threshold()
    try:
        tune_gc(Settings(full_gc_after=250))
        assert gc.get_threshold() == (kept[0], kept[1], 250)
        # What was alive at start-up is left out of later collections.
        assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*kept)
        gc.unfreeze()
    assert Settings().full_gc_after == 100  # ten times rarer than Python's own


class _Served(Exception):
    """Raised where the coordinator would start serving: the test has seen enough."""


def test_a_coordinator_tunes_its_garbage_collection_before_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bulksync.cli import cluster
    from bulksync.service import coordinator

    seen: list[tuple[tuple[int, int, int], int]] = []

    def serving(*args: object, **kwargs: object) -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        raise _Served

    monkeypatch.setattr(cluster, "check_redis", lambda url: None)
    monkeypatch.setattr(cluster, "check_broker", lambda app, url: None)
    monkeypatch.setattr(coordinator, "open_coordinator", serving)
    monkeypatch.setenv("BULKSYNC_FULL_GC_AFTER", "250")
    kept = gc.get_threshold()
    try:
        with pytest.raises(_Served):
            main(["coordinator", "--graph", "bulksync.demo"])
    finally:
        gc.set_threshold(*kept)
        gc.unfreeze()
    [(threshold, frozen)] = seen
    assert threshold == (kept[0], kept[1], 250)
    assert frozen > 0
