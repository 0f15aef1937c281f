"""The run commands for people, without services: the progress line, JSON inputs, the
interrupt hint, Ctrl-C, reading the demo's SQLite thread, import failures and closed pipes.

Their runs against a real cluster are in ``tests/integration/test_cli_people.py``.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bulksync.cli import EXIT_BROKEN_PIPE, main
from bulksync.cli.follow import follow, resume_hint
from bulksync.cli.inputs import json_option, one_stdin, run_config
from bulksync.cli.progress import ProgressLine, progress_text
from bulksync.errors import UsageError
from bulksync.service.events import RunEvent
from bulksync.types import Interrupt

NO_REDIS = "redis://127.0.0.1:1/0"
NO_POSTGRES = "postgresql://u:secret@127.0.0.1:1/db"


@pytest.fixture(autouse=True)
def _unreachable_services(monkeypatch: pytest.MonkeyPatch, tmp_home: Path) -> None:
    """No test here reaches a real service or the developer's own demo file."""
    monkeypatch.setenv("BULKSYNC_REDIS_URL", NO_REDIS)
    monkeypatch.setenv("BULKSYNC_BROKER_URL", NO_REDIS)
    monkeypatch.setenv("BULKSYNC_DATABASE_URL", NO_POSTGRES)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the progress line ------------------------------------------------------------------------

CHUNK: dict[str, Any] = {
    "step": 2,
    "done": 3,
    "total": 8,
    "queued": 2,
    "running": 3,
    "elapsed_s": 4.0,
    "nodes": {
        "generate": {"total": 7, "done": 2, "failed": 1, "queued": 2, "running": 2},
        "review": {"total": 1, "done": 0, "failed": 0, "queued": 0, "running": 1},
    },
}


def test_on_a_terminal_the_line_is_redrawn_cut_to_the_width_and_cleared() -> None:
    err, clock = io.StringIO(), Clock()
    line = ProgressLine(err, "pkg.graphs:a_long_graph_name", tty=True, width=40, clock=clock)
    line.draw()
    clock.now += 1.2
    line.tick()
    line.set_status("running")
    line.progress(CHUNK)
    clock.now += 1
    line.tick()
    line.finish("success")
    text = err.getvalue()
    assert text.endswith("\x1b[K\n") and text.count("\n") == 1
    frames = [part.removesuffix("\n").removesuffix("\x1b[K") for part in text.split("\r")[1:]]
    assert all(len(f) <= 39 for f in frames), frames
    assert frames[0] == "0s · queued, waiting for a coordinator…"
    assert frames[1].startswith("1s · queued")
    assert frames[3] == "1s · step 2 (4s) · tasks 3/8 · 1 faile…"
    assert frames[4].startswith("2s · step 2 (5s)")  # both clocks moved with no event
    assert frames[-1] == "2s · success"


def test_the_width_is_the_terminals_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")  # where stderr is no terminal, shutil reads it
    err = io.StringIO()
    line = ProgressLine(err, "g:" + "x" * 100, tty=True, clock=Clock())
    line.draw()
    assert len(err.getvalue()) == len("\r") + 49 + len("\x1b[K")


def test_without_a_terminal_a_line_per_change_at_most_one_a_second() -> None:
    err, clock = io.StringIO(), Clock()
    line = ProgressLine(err, "g:graph", tty=False, clock=clock)
    line.draw()
    clock.now += 0.3
    line.set_status("running")  # within the second: held back
    for _ in range(3):
        clock.now += 0.5
        line.tick()  # the change shows once, then nothing new to say
    clock.now += 0.2
    line.progress(CHUNK)
    clock.now += 1.0
    line.progress(CHUNK)  # the same counts: no line
    line.finish("success")  # the end always shows
    assert err.getvalue().splitlines() == [
        "0s · queued, waiting for a coordinator serving g:graph",
        "1s · running",
        "3s · step 2 (4s) · tasks 3/8 · 1 failed · 2 queued · 3 running · generate 3/7 "
        "(1 failed, 2 running, 2 queued) · review 0/1 (1 running)",
        "3s · success",
    ]


def test_progress_names_the_node_of_a_one_node_step_and_never_counts_more_than_left() -> None:
    chunk = {
        "step": 1,
        "done": 3,
        "total": 3,
        "queued": 0,
        "running": 2,  # surveyed before the last results came
        "nodes": {"square": {"total": 3, "done": 3, "failed": 0, "queued": 0, "running": 2}},
        "workers": {"h:1": {"tasks": 2, "longest_s": 61.0}},
    }
    assert progress_text(chunk, 75) == (
        "step 1 (1m15s) · square 3/3 · 0 queued · 0 running on 1 worker (longest 61s)"
    )
    late = {**chunk, "waiting": [{"tasks": 3, "seconds": 40.0, "queue": "gpu"}]}
    assert "3 waiting 40s on queue 'gpu'" in progress_text(late)


# --- inputs -----------------------------------------------------------------------------------


def test_json_comes_inline_from_a_file_or_from_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = {"text": "x" * 200_000}
    path = tmp_path / "in.json"
    path.write_text(json.dumps(big))
    assert json_option("--input", '{"n": 1}') == {"n": 1}
    assert json_option("--input", f"@{path}") == big
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(big)))
    assert json_option("--input", "-") == big


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("@{tmp}/missing.json", "--input @{tmp}/missing.json: no such file"),
        ("@{tmp}", "is a directory"),
        ("@{tmp}/bad.json", "--input @{tmp}/bad.json: file {tmp}/bad.json is not valid JSON"),
        ("-", "--input -: stdin is not valid JSON"),
        ("{bad", "--input is not valid JSON"),
    ],
)
def test_a_bad_input_names_the_option_and_the_problem(
    text: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    monkeypatch.setattr(sys, "stdin", io.StringIO("not json"))
    with pytest.raises(UsageError) as caught:
        json_option("--input", text.replace("{tmp}", str(tmp_path)))
    assert message.replace("{tmp}", str(tmp_path)) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_config_and_recursion_limit() -> None:
    assert run_config(None, None) is None
    assert run_config('{"tags": ["a"]}', 7) == {"tags": ["a"], "recursion_limit": 7}
    with pytest.raises(UsageError, match="--config key 'callbacks' does not travel"):
        run_config('{"callbacks": []}', None)
    with pytest.raises(UsageError, match="--config must be a JSON object, got list"):
        run_config("[1]", None)
    with pytest.raises(UsageError, match="--input and --config both read stdin"):
        one_stdin(**{"--input": "-", "--config": "-"})


def test_submit_reads_its_inputs_before_it_connects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["submit", "g:graph", "--input", f"@{tmp_path}/none.json"]
    assert main(argv) == 2
    line = error_line(capsys)
    assert line.startswith(f"bulksync submit: error: --input {argv[3]}: no such file"), line
    assert main(["resume", "t", "--graph", "g:g", "--value", "1", "--config", "@/nope.json"]) == 2
    assert error_line(capsys).startswith("bulksync resume: error: --config @/nope.json:")


# --- following a run --------------------------------------------------------------------------


def interrupted(*found: Interrupt) -> Any:
    return SimpleNamespace(
        run_id="r1",
        thread_id="my thread",
        graph_id="pkg.mod:graph",
        kind="invoke",
        status="interrupted",
        error=None,
        output={"text": "hi", "__interrupt__": list(found)},
        created_at=None,
        updated_at=None,
    )


def test_the_hint_gives_the_resume_command_with_a_placeholder() -> None:
    lines = resume_hint(interrupted(Interrupt({"approve?": True}, "a" * 32)))
    assert lines[0] == "run r1 waits for an answer on thread my thread:"
    assert lines[1] == '  {"approve?": true}'
    assert shlex.split(lines[-1]) == [
        "bulksync",
        "resume",
        "my thread",
        "--graph",
        "pkg.mod:graph",
        "--value",
        "<JSON>",
        "--wait",
    ]
    several = resume_hint(interrupted(Interrupt(1, "i1"), Interrupt(2, "i2")))
    assert "  i1: 1" in several and "  i2: 2" in several
    assert shlex.split(several[-1])[6] == '{"i1": <JSON>, "i2": <JSON>}'
    assert "--input null" in resume_hint(interrupted())[-1]  # a breakpoint: continue


class FakeClient:
    """Answers ``get`` with the rows given in turn (the last one kept) and ``watch`` with
    the events given; ``stop`` raises KeyboardInterrupt in place of an event."""

    def __init__(self, rows: list[Any], events: list[Any]) -> None:
        self.rows, self.events = rows, events

    def get(self, run_id: str) -> Any:
        return self.rows.pop(0) if len(self.rows) > 1 else self.rows[0]

    def watch(self, run_id: str, after: str, *, tick: float) -> Iterator[Any]:
        for event in self.events:
            if event == "stop":
                raise KeyboardInterrupt
            yield event


def row(status: str, output: Any = None, error: str | None = None) -> Any:
    return SimpleNamespace(
        run_id="r1",
        thread_id="t1",
        graph_id="g:graph",
        kind="invoke",
        status=status,
        error=error,
        output=output,
        created_at=None,
        updated_at=None,
    )


def test_ctrl_c_leaves_the_run_going_and_says_how_to_find_it() -> None:
    out, err = io.StringIO(), io.StringIO()
    client = FakeClient([row("pending")], [None, None, "stop"])
    assert follow(client, "r1", out, err) == 130
    said = err.getvalue()
    assert "run r1 goes on" in said
    assert "bulksync follow r1" in said and "bulksync cancel r1" in said
    assert out.getvalue() == ""


def test_an_interrupted_run_prints_its_output_then_the_hint() -> None:
    out, err = io.StringIO(), io.StringIO()
    done = interrupted(Interrupt("why?", "i1"))
    events = [RunEvent("1-0", (), "values", {}), RunEvent("2-0", (), "end", {})]
    assert follow(FakeClient([row("running"), done], events), "r1", out, err) == 0
    assert json.loads(out.getvalue())["text"] == "hi"
    assert "bulksync resume 'my thread' --graph pkg.mod:graph --value '<JSON>'" in err.getvalue()


def test_follow_json_is_a_line_per_event_ending_with_the_record() -> None:
    out, err = io.StringIO(), io.StringIO()
    events = [
        RunEvent("1-0", (), "progress", CHUNK),
        RunEvent("2-0", (), "values", {"n": 1}),
        RunEvent("3-0", (), "end", {"status": "error"}),
    ]
    failed = row("error", error="KeyError: 'x'")
    assert (
        follow(FakeClient([row("running"), failed], events), "r1", out, err, output="events") == 1
    )
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["id"], x["mode"]) for x in lines] == [
        ("1-0", "progress"),
        ("2-0", "values"),
        ("3-0", "end"),
    ]
    assert lines[-1]["data"]["status"] == "error" and lines[-1]["data"]["error"] == "KeyError: 'x'"
    assert "ended with status error: KeyError: 'x'" in err.getvalue()


# --- the demo's thread in SQLite --------------------------------------------------------------


@pytest.fixture
def demo_thread(capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["demo", "--fanout", "3"]) == 0
    out = capsys.readouterr().out
    return next(x for x in out.splitlines() if x.startswith("Thread: ")).split(": ")[1]


def test_state_and_history_read_the_demos_thread(
    demo_thread: str, tmp_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["state", demo_thread]) == 0
    state = json.loads(capsys.readouterr().out)
    assert len(state["values"]["jokes"]) == 3 and state["next"] == [] and state["step"] == 3
    assert main(["history", demo_thread, "--json"]) == 0
    steps = [json.loads(x)["step"] for x in capsys.readouterr().out.splitlines()]
    assert steps == [3, 2, 1, 0, -1]
    assert main(["history", demo_thread, "--limit", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["STEP", "SOURCE", "NEXT", "CREATED", "CHECKPOINT"]
    assert table[1].split()[:3] == ["3", "loop", "-"]
    db = str(tmp_home / "demo.sqlite")
    assert main(["state", demo_thread, "--sqlite", db, "--graph", "bulksync.demo:graph"]) == 0
    assert json.loads(capsys.readouterr().out) == state


def test_an_unknown_thread_says_so(
    demo_thread: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["state", "demo-nope"]) == 2
    line = error_line(capsys)
    assert "no thread 'demo-nope' in the demo's SQLite file" in line and "--graph" in line
    assert main(["history", "t", "--sqlite", str(tmp_path / "none.sqlite")]) == 2
    assert "does not exist" in error_line(capsys)


def test_no_demo_file_yet_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["state", "demo-abc"]) == 2
    line = error_line(capsys)
    assert "the demo's SQLite file" in line and "does not exist" in line


# --- graph modules that fail, pipes that close ------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "coordinator", "api"])
def test_a_graph_module_that_fails_to_import_is_one_line(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "broken_graphs.py").write_text(
        textwrap.dedent(
            """
            import os
            DEPLOYMENT = os.environ["NOT_SET_ANYWHERE"]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main([command, "--graph", "broken_graphs:graph"]) == 2
    line = error_line(capsys)
    assert "importing module 'broken_graphs' failed: KeyError: 'NOT_SET_ANYWHERE'" in line


def test_a_closed_stdout_ends_the_command_quietly(
    demo_thread: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["history", demo_thread, "--json"]) == EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_history_into_a_closed_pipe_has_no_traceback(demo_thread: str) -> None:
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run(
        [sys.executable, "-m", "bulksync.cli", "history", demo_thread, "--json"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )
    os.close(write)
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, "")
