"""The settings flags of ``bulksync coordinator`` / ``bulksync worker``: derived, checked, winning.

No service is reached: a bad value stops the command before it connects anywhere.
"""

from __future__ import annotations

import re

import pytest

from bulksync.cli import build_parser, main
from bulksync.cli.setting_flags import apply_setting_flags
from bulksync.declaration import Declaration
from bulksync.settings import Settings, declarations

COMMANDS = {"coordinator": "coordinator", "worker": "worker"}


@pytest.fixture(autouse=True)
def _no_settings_from_the_developer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a developer's own BULKSYNC_* variables out of these tests."""
    for declared in declarations():
        monkeypatch.delenv(declared.env, raising=False)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def flagged() -> list[tuple[str, Declaration]]:
    return [(command, d) for command, group in COMMANDS.items() for d in declarations(group)]


@pytest.mark.parametrize(("command", "declared"), flagged(), ids=lambda x: getattr(x, "flag", x))
def test_help_shows_each_setting_with_its_default_and_variable(
    command: str, declared: Declaration, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps help lines
    assert declared.flag in out
    assert f"(default: {declared.default_text}; env {declared.env})" in out


def test_cluster_settings_have_no_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for command in COMMANDS:
        assert main([command, "--help"]) == 0
        out = capsys.readouterr().out
        for declared in declarations("cluster"):
            assert not re.search(rf"{re.escape(declared.flag)}(?![\w-])", out), declared.flag


def test_flags_default_to_the_declared_values() -> None:
    args = build_parser().parse_args(["coordinator", "--graph", "g"])
    for declared in declarations("coordinator"):
        assert getattr(args, declared.name) == declared.default
    assert apply_setting_flags(Settings(), args) == Settings()


def test_a_flag_overrides_its_variable_and_leaves_the_others() -> None:
    env = {"BULKSYNC_MAX_RUNS": "3", "BULKSYNC_HEARTBEAT": "9"}
    args = build_parser().parse_args(["coordinator", "--graph", "g", "--max-runs", "7"])
    got = apply_setting_flags(Settings.from_env(env), args)
    assert (got.max_runs, got.heartbeat) == (7, 9.0)  # the flag's default does not undo env


def test_a_worker_flag_overrides_its_variable() -> None:
    args = build_parser().parse_args(["worker", "--graph", "g", "--concurrency", "2"])
    got = apply_setting_flags(Settings.from_env({"BULKSYNC_CONCURRENCY": "5"}), args)
    assert got.concurrency == 2


@pytest.mark.parametrize(("command", "declared"), flagged(), ids=lambda x: getattr(x, "flag", x))
@pytest.mark.parametrize("bad", ["0", "many"])
def test_a_bad_flag_is_one_line_naming_the_flag(
    command: str, declared: Declaration, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--graph", "bulksync.demo", declared.flag, bad]) == 2
    line = error_line(capsys)
    assert line.startswith(f"bulksync: error: {declared.flag}={bad!r}: set it to a positive ")


def test_a_bad_variable_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BULKSYNC_POLL_INTERVAL", "soon")
    assert main(["coordinator", "--graph", "bulksync.demo"]) == 2
    line = error_line(capsys)
    assert line.startswith("bulksync: error: BULKSYNC_POLL_INTERVAL='soon': set it to a positive")


def test_flags_that_contradict_the_environment_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BULKSYNC_HEARTBEAT", "5")
    assert main(["coordinator", "--graph", "bulksync.demo", "--stale-after", "2"]) == 2
    line = error_line(capsys)
    assert "--stale-after" in line and "not more than the heartbeat (5 s)" in line
