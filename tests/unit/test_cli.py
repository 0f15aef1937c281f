"""The ``bulksync`` command: help, the demo on SQLite, and one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bulksync.cli import main
from bulksync.settings import DEMO_DB_NAME

URL_VARIABLES = ("BULKSYNC_BROKER_URL", "BULKSYNC_REDIS_URL", "BULKSYNC_DATABASE_URL")


@pytest.fixture(autouse=True)
def _default_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a developer's own BULKSYNC_*_URL settings out of these tests."""
    for name in URL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line a failed command printed to stderr (and nothing on stdout)."""
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def run_demo(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """Run ``bulksync demo`` and parse its report into jokes, thread, checkpoints and file."""
    assert main(["demo", *args]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    fields = dict(line.split(": ", 1) for line in lines if not line.startswith(" "))
    count, _, rest = fields["Checkpoints"].partition(" (SQLite file: ")
    return {
        "jokes": [line.removeprefix("  - ") for line in lines if line.startswith("  - ")],
        "best": fields["Best joke"],
        "thread": fields["Thread"],
        "checkpoints": int(count),
        "db": Path(rest.removesuffix(")")),
    }


def stored_state(db: Path, thread_id: str) -> tuple[dict[str, Any], int]:
    """Reopen ``db`` on a new connection: the thread's latest values and its checkpoint count."""
    from bulksync.checkpoint.sqlite import SqliteSaver
    from bulksync.demo import build_demo_graph

    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    with SqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_demo_graph().compile(checkpointer=saver)
        values: dict[str, Any] = graph.get_state(config).values
        return values, sum(1 for _ in saver.list(config))


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"]])
def test_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "usage: bulksync" in out
    assert "demo" in out


def test_demo_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--fanout", "--db", "--thread-id"):
        assert option in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("bulksync ")


@pytest.mark.parametrize(
    "argv", [[], ["nonsense"], ["demo", "--fanout", "0"], ["demo", "--fanout", "many"]]
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert "Traceback" not in err


def test_demo_runs_and_checkpoints_to_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "nested" / "dir" / "checkpoints.sqlite"
    report = run_demo(capsys, "--db", str(db), "--fanout", "3", "--thread-id", "t-1")
    assert report["db"] == db
    assert report["thread"] == "t-1"
    assert len(report["jokes"]) == 3
    assert report["best"] in report["jokes"]
    values, count = stored_state(db, "t-1")
    assert report["checkpoints"] == count > 0
    assert values["jokes"] == report["jokes"]
    assert values["best_joke"] == report["best"]


def test_demo_prints_a_bounded_report_for_a_large_fanout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "big.sqlite"
    report = run_demo(capsys, "--db", str(db), "--fanout", "25", "--thread-id", "big")
    values, _ = stored_state(db, "big")
    assert len(values["jokes"]) == 25
    assert report["jokes"] == values["jokes"][: len(report["jokes"])]
    assert len(report["jokes"]) < 25


def test_demo_defaults_to_bulksync_home(tmp_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_demo(capsys, "--fanout", "2")
    assert report["db"] == tmp_home / DEMO_DB_NAME
    assert report["db"].is_file()
    assert report["thread"]


def test_each_demo_run_gets_its_own_thread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "shared.sqlite"
    first = run_demo(capsys, "--db", str(db), "--fanout", "2")
    second = run_demo(capsys, "--db", str(db), "--fanout", "2")
    assert first["thread"] != second["thread"]
    assert first["checkpoints"] == second["checkpoints"]
    values, count = stored_state(db, first["thread"])
    assert count == first["checkpoints"]
    assert len(values["jokes"]) == 2


def test_db_under_a_file_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    assert main(["demo", "--db", str(blocker / "sub" / "demo.sqlite")]) == 2
    line = error_line(capsys)
    assert str(blocker) in line
    assert "--db" in line


def test_db_that_is_a_directory_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--db", str(tmp_path)]) == 2
    line = error_line(capsys)
    assert f"{tmp_path} is a directory" in line


def test_db_that_is_not_sqlite_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("do not overwrite me\n")
    assert main(["demo", "--db", str(precious)]) == 2
    assert "not a SQLite database" in error_line(capsys)
    assert precious.read_text() == "do not overwrite me\n"


def test_unwritable_home_is_one_line_error(
    tmp_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_home.parent.mkdir(parents=True, exist_ok=True)
    tmp_home.write_text("a file where BULKSYNC_HOME should be a directory")
    assert main(["demo"]) == 2
    line = error_line(capsys)
    assert str(tmp_home) in line
    assert "BULKSYNC_HOME" in line


@pytest.mark.parametrize("variable", URL_VARIABLES)
def test_bad_url_setting_is_one_line_error(
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, "http://127.0.0.1:1/")
    assert main(["demo", "--db", str(tmp_path / "x.sqlite")]) == 2
    assert variable in error_line(capsys)
    assert not (tmp_path / "x.sqlite").exists()


def test_flower_hands_every_option_to_flower() -> None:
    from bulksync.cli import build_parser

    argv = ["flower", "--port=5555", "--basic-auth", "admin:secret", "--help"]
    args = build_parser().parse_args(argv)
    assert args.options == argv[1:]  # even --help: Flower's own help lists its options
