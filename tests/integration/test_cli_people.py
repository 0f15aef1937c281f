"""The run commands as people and their scripts use them, against a real cluster.

A ``bulksync worker`` and a ``bulksync coordinator`` process serve this module's graphs on a
Postgres schema and a Celery queue of their own (the helpers of ``api/conftest.py``); every
command runs as a subprocess, its stderr on a pseudo-terminal where the progress line is
under test, else on a pipe.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import operator
import os
import pty
import re
import shlex
import signal
import struct
import subprocess
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.client import Client
from bulksync.errors import ThreadGraphError
from bulksync.graph import END, START, StateGraph
from bulksync.settings import Settings
from bulksync.types import Send, interrupt

from .api.conftest import ApiServer, Process, bulksync_command, private_cluster, wait_served

pytestmark = pytest.mark.integration

MODULE = "tests.integration.test_cli_people"
SLOW = f"{MODULE}:slow"
ASK = f"{MODULE}:ask"
NOBODY = f"{MODULE}:nobody"  # no process serves it
WAIT = 120.0
WIDTH = 80


# --- the graphs the cluster serves ------------------------------------------------------------


class Numbers(TypedDict, total=False):
    items: list[int]
    seconds: float
    squares: Annotated[list[int], operator.add]
    total: int


def _square(task: dict[str, Any]) -> dict[str, Any]:
    time.sleep(task["seconds"])
    return {"squares": [task["n"] * task["n"]]}


def _slow() -> Any:
    """One ``square`` task per item, each sleeping ``seconds``; then ``sum``."""
    builder = StateGraph(Numbers)
    builder.add_node("square", _square)
    builder.add_node("sum", lambda s: {"total": sum(s["squares"])})
    builder.add_conditional_edges(
        START,
        lambda s: [Send("square", {"n": n, "seconds": s.get("seconds", 0.0)}) for n in s["items"]],
        ["square"],
    )
    builder.add_edge("square", "sum")
    builder.add_edge("sum", END)
    return builder.compile()


class Question(TypedDict, total=False):
    text: str
    answer: str


def _ask() -> Any:
    """One node that asks about ``text`` with ``interrupt`` and stores the answer."""
    builder = StateGraph(Question)
    builder.add_node("ask", lambda s: {"answer": interrupt({"approve?": len(s["text"])})})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


slow = _slow()
ask = _ask()


# --- the cluster ------------------------------------------------------------------------------


@dataclasses.dataclass
class Cli:
    """Runs ``bulksync`` commands against the module's cluster."""

    server: ApiServer

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def client(self) -> Client:
        return Client(self.server.settings)

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``bulksync args``, its output captured (stderr on a pipe: not a terminal)."""
        return subprocess.run(
            [*bulksync_command(), *args],
            env=self.env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )

    def json(self, *args: str, stdin: str | None = None) -> Any:
        done = self.run(*args, "--json", stdin=stdin)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def cli(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, database_url: str
) -> Iterator[Cli]:
    extra = {
        # Where a step's tasks are (queued, running) is surveyed every claim heartbeat.
        "BULKSYNC_CLAIM_HEARTBEAT": "0.5",
        "BULKSYNC_HOME": str(tmp_path_factory.mktemp("home")),
    }
    with private_cluster(tmp_path_factory, settings, database_url, "cli", **extra) as server:
        server.env.pop("COLUMNS", None)  # the progress line must read the terminal's own width
        graphs = ["--graph", SLOW, "--graph", ASK]
        server.start("worker", *graphs, "--pool", "threads", "--concurrency", "8")
        coordinator: Process = server.start("coordinator", *graphs, "--loglevel", "WARNING")
        wait_served(server, coordinator, SLOW)
        yield Cli(server)


# --- the progress line ------------------------------------------------------------------------


@dataclasses.dataclass
class OnTerminal:
    """A command whose stderr is a pseudo-terminal of ``WIDTH`` columns."""

    proc: subprocess.Popen[str]
    master: int
    chunks: list[bytes]
    reader: threading.Thread

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace").replace("\r\n", "\n")

    def wait(self) -> tuple[int, str, str]:
        """The exit code, stdout, and what the terminal showed."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        code = self.proc.wait(timeout=WAIT)
        self.reader.join(timeout=10)
        os.close(self.master)
        return code, out, self.text()


def on_terminal(cli: Cli, *args: str) -> OnTerminal:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, WIDTH, 0, 0))
    proc = subprocess.Popen(
        [*bulksync_command(), *args],
        env=cli.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the last writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return OnTerminal(proc, master, chunks, reader)


def frames(text: str) -> list[str]:
    """The redraws of the progress line: what each ``\\r`` starts, up to its clear code."""
    found = []
    for part in text.split("\r")[1:]:
        assert part.endswith("\x1b[K") or part.endswith("\x1b[K\n"), repr(part)
        found.append(part.split("\x1b[K")[0])
    return found


def clock(frame: str) -> int:
    """The seconds a frame shows first (``7s``, ``1m05s``)."""
    match = re.match(r"(?:(\d+)m)?(\d+)s · ", frame)
    assert match, frame
    return int(match[1] or 0) * 60 + int(match[2])


def test_on_a_terminal_the_line_is_redrawn_in_place_and_fits(cli: Cli) -> None:
    items = json.dumps({"items": [1, 2, 3], "seconds": 3})
    term = on_terminal(cli, "submit", SLOW, "--input", items, "--wait")
    code, out, err = term.wait()
    assert code == 0, err
    assert json.loads(out)["total"] == 14
    shown = frames(err)
    assert shown and all(len(f) < WIDTH for f in shown), shown  # never wraps
    running = [f for f in shown if "step " in f]
    assert running and any("running" in f for f in running), shown
    assert not any("waiting for a coordinator" in f for f in shown[shown.index(running[0]) :])
    assert len({clock(f) for f in running}) >= 3, shown  # it ticked through the 3 s step
    assert shown[-1].endswith("success")
    assert err.endswith("\x1b[K\n")  # the line ends, nothing left after it


def test_a_queued_run_ticks_and_ctrl_c_leaves_it_queued(cli: Cli) -> None:
    term = on_terminal(cli, "submit", NOBODY, "--input", "{}", "--queue-anyway", "--wait")
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and "2s · queued" not in term.text():
        time.sleep(0.1)  # waiting for the clock to reach 2 s, with no event at all
    term.proc.send_signal(signal.SIGINT)
    code, _, err = term.wait()
    assert code == 130, err
    shown = frames(err.split("bulksync: stopped watching")[0])
    assert [clock(f) for f in shown][:3] == [0, 1, 2], shown
    # Cut to the terminal's width: the graph id does not fit in 80 columns.
    wanted = f"queued, waiting for a coordinator serving {NOBODY}"
    assert all(wanted.startswith(f.partition(" · ")[2].rstrip("…")) for f in shown), shown
    assert all(len(f) == WIDTH - 1 and f.endswith("…") for f in shown), shown
    run_id = re.search(r"bulksync follow (\S+)", err)
    assert run_id and f"bulksync cancel {run_id[1]}" in err, err
    with cli.client() as client:
        assert client.get(run_id[1]).status == "pending"  # the run goes on
        client.cancel(run_id[1])


def test_without_a_terminal_progress_is_plain_lines(cli: Cli) -> None:
    began = time.monotonic()
    done = cli.run("submit", SLOW, "--input", '{"items": [1, 2], "seconds": 2}', "--wait")
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    header, *lines = done.stderr.splitlines()
    assert header.startswith("run ") and f"graph {SLOW}" in header
    assert lines[-1].endswith("success")
    assert 2 <= len(lines) <= took + 2, lines  # at most one a second (and the last)
    texts = [line.partition(" · ")[2] for line in lines]
    assert all(a != b for a, b in itertools.pairwise(texts)), lines  # only changes


# --- interrupts, inputs, JSON -----------------------------------------------------------------


def test_an_interrupt_prints_the_command_that_answers_it(cli: Cli) -> None:
    done = cli.run("submit", ASK, "--input", '{"text": "hello"}', "--wait")
    assert done.returncode == 0, done.stderr
    thread = re.search(r"thread (\S+)", done.stderr)
    assert thread, done.stderr
    assert '{"approve?": 5}' in done.stderr
    command = re.search(r"^\s+(bulksync resume .*)$", done.stderr, re.M)
    assert command, done.stderr
    argv = shlex.split(command[1])
    assert argv[:5] == ["bulksync", "resume", thread[1], "--graph", ASK]
    assert argv[argv.index("--value") + 1] == "<JSON>"
    argv[argv.index("--value") + 1] = '"yes"'
    answered = cli.run(*argv[1:])
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout) == {"text": "hello", "answer": "yes"}


def test_large_inputs_come_from_a_file_or_stdin(cli: Cli, tmp_path: Path) -> None:
    text = "x" * 200_000  # more than one command-line argument may hold
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"text": text}))
    queued = cli.json("submit", ASK, "--input", f"@{path}")
    assert set(queued) == {"run_id", "thread_id"}
    lines = cli.run("follow", queued["run_id"], "--json").stdout.splitlines()
    end = json.loads(lines[-1])
    assert end["mode"] == "end" and end["data"]["status"] == "interrupted"
    assert end["data"]["interrupts"][0]["value"] == {"approve?": 200_000}

    record = cli.json("submit", ASK, "--input", "-", "--wait", stdin=json.dumps({"text": text}))
    assert record["status"] == "interrupted" and record["output"]["text"] == text


def test_bad_inputs_are_one_line_naming_the_option(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    for args, message in [
        (["--input", f"@{tmp_path / 'missing.json'}"], "--input @"),
        (["--input", f"@{tmp_path / 'bad.json'}"], "is not valid JSON"),
        (["--input", "-", "--config", "-"], "--input and --config both read stdin"),
        (["--input", "{}", "--config", '{"callbacks": 1}'], "--config key 'callbacks'"),
    ]:
        done = cli.run("submit", SLOW, *args)
        assert done.returncode == 2 and done.stdout == "", done
        assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


def test_config_and_recursion_limit_reach_the_run(cli: Cli) -> None:
    record = cli.json(
        "submit", SLOW, "--input", '{"items": [2]}', "--config", '{"tags": ["cli"]}', "--wait"
    )
    with cli.client() as client:
        config = client.get(record["run_id"]).payload["config"]
    assert config["tags"] == ["cli"] and record["output"]["total"] == 4
    done = cli.run("submit", SLOW, "--input", '{"items": [2]}', "--recursion-limit", "1", "--wait")
    assert done.returncode == 1 and "ended with status error" in done.stderr, done.stderr
    assert "Recursion limit of 1" in done.stderr, done.stderr


def test_follow_attaches_from_the_start_or_after_an_event(cli: Cli) -> None:
    queued = cli.json("submit", SLOW, "--input", '{"items": [1, 2], "seconds": 0.5}')
    lines = cli.run("follow", queued["run_id"], "--json").stdout.splitlines()
    everything = [json.loads(x) for x in lines]
    assert everything[-1]["mode"] == "end" and everything[-1]["data"]["output"]["total"] == 5
    after = cli.run("follow", queued["run_id"], "--after", everything[1]["id"], "--json")
    assert [json.loads(x) for x in after.stdout.splitlines()] == everything[2:]
    human = cli.run("follow", queued["run_id"])
    assert human.returncode == 0 and json.loads(human.stdout)["total"] == 5
    assert cli.run("follow", "no-such-run").returncode == 2


def test_runs_state_history_and_cancel_speak_json(cli: Cli) -> None:
    record = cli.json("submit", SLOW, "--input", '{"items": [3]}', "--wait")
    thread, run_id = record["thread_id"], record["run_id"]
    assert record["status"] == "success" and record["output"]["total"] == 9

    [listed] = cli.json("runs", "--thread", thread)
    assert (listed["run_id"], listed["status"], listed["kind"]) == (run_id, "success", "invoke")
    state = cli.json("state", thread, "--graph", SLOW)
    assert state["values"]["total"] == 9 and state["next"] == []
    history = cli.run("history", thread, "--graph", SLOW, "--json").stdout.splitlines()
    assert [json.loads(x)["step"] for x in history] == [2, 1, 0, -1]
    table = cli.run("history", thread, "--graph", SLOW).stdout.splitlines()
    assert table[0].split() == ["STEP", "SOURCE", "NEXT", "CREATED", "CHECKPOINT"]

    cancelled = cli.json("cancel", run_id)
    assert cancelled == {
        "run_id": run_id,
        "status": "success",
        "cancelled": False,
        "already_finished": True,
    }
    said = cli.run("cancel", run_id).stdout
    assert said.strip() == f"{run_id}: already finished (success); nothing to cancel"


def test_an_unknown_thread_says_so(cli: Cli) -> None:
    done = cli.run("state", f"nope-{uuid.uuid4().hex[:6]}", "--graph", SLOW)
    assert done.returncode == 2 and "no thread 'nope-" in done.stderr, done.stderr


# --- reads, threads and their graphs ----------------------------------------------------------


def test_reads_are_not_runs_of_the_thread(cli: Cli) -> None:
    record = cli.json("submit", SLOW, "--input", '{"items": [1]}', "--wait")
    thread = record["thread_id"]
    assert cli.run("state", thread, "--graph", SLOW).returncode == 0
    assert [r["kind"] for r in cli.json("runs", "--thread", thread)] == ["invoke"]
    kinds = [r["kind"] for r in cli.json("runs", "--thread", thread, "--reads")]
    assert kinds == ["get_state", "invoke"]

    # A read nobody answers does not hold up the next run on its thread.
    fresh = f"t-{uuid.uuid4().hex[:8]}"
    with cli.client() as client:
        payload = {"config": {"configurable": {"thread_id": fresh}}, "options": {}}
        read = client.create_run(NOBODY, "get_state", payload, require_coordinator=False)
        done = cli.run("submit", SLOW, "--thread", fresh, "--input", '{"items": [2]}', "--wait")
        assert done.returncode == 0, done.stderr
        assert client.get(read).status == "pending"
        client.cancel(read)


def test_a_thread_is_bound_to_its_graph(cli: Cli) -> None:
    record = cli.json("submit", SLOW, "--input", '{"items": [1]}', "--wait")
    thread = record["thread_id"]
    message = f"thread '{thread}' belongs to graph '{SLOW}', not '{ASK}'"
    for args in (
        ["submit", ASK, "--thread", thread, "--input", '{"text": "x"}'],
        ["state", thread, "--graph", ASK],
        ["history", thread, "--graph", ASK],
        ["resume", thread, "--graph", ASK, "--value", '"yes"'],
    ):
        done = cli.run(*args)
        assert done.returncode == 2 and done.stdout == "", done
        assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr
    with cli.client() as client, pytest.raises(ThreadGraphError, match=message):
        client.submit(ASK, {"text": "x"}, thread_id=thread)
    assert cli.json("state", thread, "--graph", SLOW)["values"]["total"] == 1  # unharmed


def test_output_into_a_closed_pipe_exits_quietly(cli: Cli) -> None:
    record = cli.json("submit", SLOW, "--input", '{"items": [1, 2, 3]}', "--wait")
    for args in (["runs"], ["history", record["thread_id"], "--graph", SLOW, "--json"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line: like `| head -0`
        done = subprocess.run(
            [*bulksync_command(), *args],
            env=cli.env,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=WAIT,
        )
        os.close(write)
        assert (done.returncode, done.stderr) == (141, ""), done.stderr
    shell = subprocess.run(
        ["bash", "-c", f"{shlex.join(bulksync_command())} runs | head -1"],
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert shell.stdout.startswith("RUN") and shell.stderr == "", shell.stderr
