"""The benchmark's graphs and command line, checked in-process on tiny sizes (no timing).

The benchmark itself (``python -m bench.run``) starts workers and is never run by pytest.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import types
import uuid
from typing import Any

import pytest

from bench import graphs, measure, parts, report, run
from bench.workers import worker_command


@pytest.fixture(scope="module")
def langgraph() -> graphs.Api:
    return graphs.langgraph_api()


def test_fanout_graph_gives_langgraphs_answer(langgraph: graphs.Api) -> None:
    ours = graphs.fanout_builder(graphs.BULKSYNC).compile()
    theirs = graphs.fanout_builder(langgraph).compile()
    out = ours.invoke(graphs.fanout_input(7))
    assert out == theirs.invoke(graphs.fanout_input(7))
    assert out["out"] == list(range(7))


def test_loop_graph_gives_langgraphs_answer(langgraph: graphs.Api) -> None:
    steps = 30  # past LangGraph's default recursion limit of 25: loop_config raises it
    ours = graphs.loop_builder(graphs.BULKSYNC).compile()
    theirs = graphs.loop_builder(langgraph).compile()
    config = graphs.loop_config(steps)
    out = ours.invoke(graphs.loop_input(steps), config)
    assert out == theirs.invoke(graphs.loop_input(steps), config) == {"i": steps, "n": steps}


@pytest.mark.parametrize(
    "node", [graphs.wait, graphs.await_, graphs.burn], ids=["sync", "async", "cpu"]
)
def test_waiting_graph_gives_langgraphs_answer(langgraph: graphs.Api, node: Any) -> None:
    ours = graphs.waiting_builder(graphs.BULKSYNC, node).compile()
    theirs = graphs.waiting_builder(langgraph, node).compile()
    given = graphs.waiting_input(5, 0.001)
    out = asyncio.run(ours.ainvoke(given))
    assert out == asyncio.run(theirs.ainvoke(given))
    assert out["out"] == list(range(5))


def test_line_graph_gives_langgraphs_answer(langgraph: graphs.Api) -> None:
    ours = graphs.line_builder(graphs.BULKSYNC).compile()
    theirs = graphs.line_builder(langgraph).compile()
    out = ours.invoke(graphs.LINE_INPUT)
    assert out == theirs.invoke(graphs.LINE_INPUT) == graphs.LINE_OUTPUT
    measure.line_runs(ours, 2)()  # checks each answer


def test_chat_graph_gives_langgraphs_answer(langgraph: graphs.Api) -> None:
    ours = graphs.chat_builder(graphs.BULKSYNC).compile()
    theirs = graphs.chat_builder(langgraph).compile()
    out = ours.invoke({"messages": [], "n": 4})
    assert out == theirs.invoke({"messages": [], "n": 4})
    assert [len(m) for m in out["messages"]] == [graphs.MESSAGE_BYTES] * 4
    assert len(set(out["messages"])) == 4


def test_module_graphs_are_what_workers_load() -> None:
    from bulksync.workers.registry import GraphRegistry

    registry = GraphRegistry()
    loaded = ["aio_fanout", "chat", "cpu_fanout", "fanout", "io_fanout", "line", "loop"]
    assert registry.load("bench.graphs") == [f"bench.graphs:{name}" for name in loaded]


def test_measured_runs_check_their_answers() -> None:
    class Wrong:
        def invoke(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"n": 3, "out": [1, 0, 2], "i": 0}

    with pytest.raises(measure.BenchError, match="out of order"):
        measure.graph_fanout(Wrong(), 3)()
    with pytest.raises(measure.BenchError, match="loop of 3 steps"):
        measure.sequential(Wrong(), 3, None)()
    with pytest.raises(measure.BenchError, match="line run ended with"):
        measure.line_runs(Wrong(), 1)()

    class Short:
        def invoke(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"messages": ["one"], "n": 3}

        def get_state(self, config: Any) -> Any:
            return types.SimpleNamespace(values={"messages": ["one"]})

    with pytest.raises(measure.BenchError, match="chat of 3 messages ended with 1"):
        measure.chat_thread(Short(), "t", 3)
    with pytest.raises(measure.BenchError, match="the state read 1 of 3 messages"):
        measure.read_state(Short(), "t", 3)()


@pytest.mark.parametrize("at_once", [False, True])
def test_detached_runs_check_their_answers(at_once: bool) -> None:
    class Failing:
        def submit(self, graph_id: str, value: Any, *, thread_id: str) -> str:
            return "run-1"

        def wait(self, run_id: str, timeout: float) -> Any:
            return types.SimpleNamespace(status="error", output=None, error="boom")

    with pytest.raises(measure.BenchError, match="detached run run-1: error, None boom"):
        measure.detached_line_runs(Failing(), "bench.graphs:line", 2, at_once=at_once)()


def test_compare_times_every_contender_each_round() -> None:
    calls: list[str] = []
    timings = measure.compare(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=2, warmup=1
    )
    assert calls == ["a", "b"] * 3
    assert {label: len(t.seconds) for label, t in timings.items()} == {"a": 2, "b": 2}


def test_ratio_is_of_medians_with_the_range_round_by_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fast, slow = measure.Timing("a", [1.0, 2.0, 6.0]), measure.Timing("b", [2.0, 2.0, 3.0])
    assert report.ratio("a / b", fast, slow, "target: <= 1.00") == 1.0
    assert " ".join(capsys.readouterr().out.split()) == (
        "a / b 1.00 target: <= 1.00 (rounds 0.50-2.00)"
    )
    assert report.round_ratios(fast, measure.Timing("limit", [2.0])) == [0.5, 1.0, 3.0]
    assert report.round_ratios(measure.Timing("one", [4.0]), slow) == [2.0, 2.0, 4.0 / 3.0]
    assert report.round_ratios(fast, measure.Timing("c", [1.0, 2.0])) == []
    report.ratio("a / limit", measure.Timing("a", [1.0]), measure.Timing("l", [2.0]), "(context)")
    assert "rounds" not in capsys.readouterr().out  # one round: no range to show


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")
def test_cpu_per_run_is_what_the_watched_processes_spent_per_call() -> None:
    def burn() -> None:
        deadline = time.thread_time() + 0.2
        while time.thread_time() < deadline:
            pass

    pid = os.getpid()
    cpu = measure.CpuPerRun(
        {
            "this process": lambda: measure.process_cpu([pid]),
            "gone": lambda: measure.process_cpu([2**22 + 7]),  # above any pid_max
        },
        calls=5,
    )
    watched = cpu.watch(burn)
    watched()
    watched()
    spent = cpu.medians()
    assert set(spent) == {"this process"}  # a process /proc cannot read is left out
    # 200 ms over 5 runs per call, read in clock ticks; other threads may add a little.
    assert 0.15 / 5 <= spent["this process"] < 2.0 / 5


@pytest.mark.skipif(not os.path.exists("/proc/self/comm"), reason="reads Linux's /proc")
def test_server_cpu_counts_the_processes_of_that_name() -> None:
    with open("/proc/self/comm") as comm:
        mine = comm.read().strip()
    used = measure.server_cpu(mine)
    assert used is not None and used >= measure.process_cpu([os.getpid()])  # type: ignore[operator]
    assert measure.server_cpu("no-such-server") is None  # not on this machine


def test_cpu_budget_prints_the_floor_and_what_the_cores_allow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spent = {
        "bulksync": {"coordinator": 0.008, "workers": 0.008, "redis": 0.002, "postgres": 0.003},
        "LangGraph": {"client": 0.007, "postgres": 0.002},
        "in-process": {"client": 0.004, "postgres": 0.001},
        "raw": {"workers": 0.006, "client": 0.002, "redis": 0.002},
    }
    parts.cpu_budget(spent, lg_rate=100.0)
    out = capsys.readouterr().out
    cores = os.cpu_count() or 1
    shares = "coordinator 8.00, workers 8.00, redis 2.00, postgres 3.00"
    assert f"bulksync    21.00 ms  ({shares})" in out
    assert "raw Celery's + the in-process loop's = 15.00 ms" in out  # 10 + 5
    assert f"{cores} cores run at most {cores / 0.015:.1f} runs/s" in out
    assert f"= {cores / 0.015 / 100:.2f} x LangGraph + PostgresSaver" in out
    assert "bulksync spends 1.40 x the floor" in out
    parts.cpu_budget({**spent, "raw": {}}, lg_rate=100.0)  # /proc could not tell
    assert capsys.readouterr().out == ""


def test_command_line_defaults_and_reproduction() -> None:
    args = run.parse_args([])
    assert (args.fanout, args.steps, args.workers, args.repeat) == (1000, 100, 2, 5)
    assert "python -m bench.run --fanout 1000 --steps 100 --workers 2" in run.reproduce(args)
    assert (args.io, args.io_wait, args.io_concurrency) == (1000, 0.05, 50)
    assert "--io 1000 --io-wait 0.05 --io-concurrency 50" in run.reproduce(args)
    assert (args.e2e, args.runs, args.chat, args.cpu, args.cpu_work) == (20, 200, 500, 200, 0.02)
    assert "--e2e 20 --runs 200 --chat 500 --cpu 200 --cpu-work 0.02" in run.reproduce(args)
    with pytest.raises(SystemExit):
        run.parse_args(["--workers", "0"])


def test_speed_times_the_quickest_of_its_tries() -> None:
    line = run.speed(steps=20_000, tries=2)
    took = r"an empty 20,000-step Python loop took \d+\.\d{3} s \(quickest of 2\)"
    assert re.fullmatch(took, line)


def test_settings_use_a_private_queue() -> None:
    one, two = run.bench_settings({}), run.bench_settings({})
    assert one.queue.startswith("bench-") and one.queue != two.queue
    assert one.database_url == run.DEFAULT_DATABASE_URL


def test_worker_command_is_bulksync_worker() -> None:
    cmd = worker_command("bench.graphs", "w@%h", 1, "prefork")
    assert cmd[cmd.index("worker") :][:3] == ["worker", "--graph", "bench.graphs"]
    assert "--pool" in cmd and "--concurrency" in cmd


def test_a_missing_service_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BULKSYNC_REDIS_URL", "redis://127.0.0.1:1/0")
    assert run.main(["--fanout", "0", "--steps", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench: error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert "BULKSYNC_REDIS_URL" in err and "\n" not in err


@pytest.mark.integration
def test_a_worker_that_cannot_start_is_reported_and_stopped(settings: Any, redis_url: str) -> None:
    import dataclasses

    from bench.workers import Workers, WorkerStartError
    from bulksync.workers.celery.app import make_app

    settings = dataclasses.replace(settings, queue=f"bench-test-{uuid.uuid4().hex[:8]}")
    workers = Workers(settings, make_app(settings), 1, graph_ref="bench.no_such_module")
    with (
        pytest.raises(WorkerStartError, match=r"cannot import module 'bench\.no_such_module'"),
        workers,
    ):
        pass
    assert workers.procs == []  # stopped and reaped
