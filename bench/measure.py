"""What the benchmark times: each function returns one run's callable, checked for its answer.

A run that gives a wrong answer raises ``BenchError`` instead of producing a figure: a fast
wrong result is not a result.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
import redis
from celery import group

from bench import graphs

GATHER_TIMEOUT: Final = 120


class BenchError(RuntimeError):
    """Raised when a measured run gives a wrong answer or never finishes."""


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of each timed run of one contender."""

    label: str
    seconds: list[float]

    @property
    def median(self) -> float:
        """The median run."""
        return statistics.median(self.seconds)


def process_cpu(pids: Sequence[int]) -> float | None:
    """CPU seconds the processes ``pids`` and their children have used so far (user and
    system, from ``/proc``); None where ``/proc`` cannot tell (not Linux, a process gone)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in _with_children(pids):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def server_cpu(name: str) -> float | None:
    """CPU seconds the processes named ``name`` (``postgres``, ``redis-server``) on this
    machine have used so far, their reaped children's included (a database's finished
    connections); None where none runs here or ``/proc`` cannot tell."""
    pids = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{entry.name}/comm") as comm:
                if entry.name.isdigit() and comm.read().strip() == name:
                    pids.append(int(entry.name))
        except OSError:  # not a process, or one that ended meanwhile
            continue
    return process_cpu(pids) if pids else None


def _with_children(pids: Sequence[int]) -> list[int]:
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                todo += [int(c) for c in children.read().split()]
        except OSError:
            pass
    return found


@dataclass
class CpuPerRun:
    """CPU seconds per timed call of a contender, for each group watched: a group is a
    function giving the CPU seconds its processes have used so far (None: cannot tell)."""

    groups: dict[str, Callable[[], float | None]]
    calls: int
    used: dict[str, list[float]] = field(default_factory=dict)

    def watch(self, run: Callable[[], None]) -> Callable[[], None]:
        """``run``, noting what each group spent in it."""

        def watched() -> None:
            before = {name: used() for name, used in self.groups.items()}
            run()
            for name, used in self.groups.items():
                after, was = used(), before[name]
                if after is not None and was is not None:
                    self.used.setdefault(name, []).append((after - was) / self.calls)

        return watched

    def medians(self) -> dict[str, float]:
        """Each group's median CPU seconds per call (groups that could not tell left out)."""
        return {name: statistics.median(v) for name, v in self.used.items() if v}


def compare(runs: dict[str, Callable[[], None]], reps: int, warmup: int = 1) -> dict[str, Timing]:
    """Time ``reps`` runs of each contender after ``warmup`` untimed rounds.

    Runs are interleaved round by round, so a drift in machine load touches every contender.
    Each timed run starts after a full garbage collection, so none pays for the garbage
    another left: in this process (LangGraph imported) a full collection takes 60-170 ms,
    and one came about every fourth run, so in the rotation it fell on the same contender
    round after round (the durable fan-out's, which allocates the most).
    """
    for _ in range(warmup):
        for run in runs.values():
            run()
    seconds: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(reps):
        for label, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            run()
            seconds[label].append(time.perf_counter() - start)
    return {label: Timing(label, values) for label, values in seconds.items()}


# -- fan-out ----------------------------------------------------------------------------


def graph_fanout(
    graph: Any,
    n: int,
    given: dict[str, Any] | None = None,
    *,
    config: dict[str, Any] | None = None,
    awaited: bool = False,
    durability: str | None = None,
) -> Callable[[], None]:
    """One invoke of a fan-out graph (bulksync or LangGraph), checked for Send order; its
    input ``given`` (default: the trivial fan-out's), ``awaited``: through ``ainvoke``;
    with ``durability``, checkpointed on a new thread each run."""
    want = list(range(n))
    value = graphs.fanout_input(n) if given is None else given

    def run() -> None:
        conf, kw = config, {}
        if durability is not None:
            conf = {**(config or {}), "configurable": {"thread_id": f"bench-{uuid.uuid4().hex}"}}
            kw = {"durability": durability}
        if awaited:
            out = asyncio.run(graph.ainvoke(value, conf, **kw))
        else:
            out = graph.invoke(value, conf, **kw)
        if out["out"] != want:
            raise BenchError(f"fan-out of {n} returned {len(out['out'])} results, out of order")

    return run


def raw_celery_fanout(app: Any, redis_url: str, n: int) -> Callable[[], None]:
    """A Celery ``group`` of ``n`` raw tasks, gathered by ``BLPOP`` on the list they push to.

    bulksync's gatherer blocks on a Redis list its workers push results to; the raw tasks do
    the same (one ``RPUSH`` each), so both sides pay the same kind of gather and the raw side
    needs no Celery result backend (bulksync's app has none, by design).
    """
    client = redis.Redis.from_url(redis_url)

    def run() -> None:
        key = f"bench:raw:{uuid.uuid4().hex}"
        try:
            group(
                (app.signature(graphs.RAW_TASK, args=(redis_url, key, i)) for i in range(n)),
                app=app,
            ).apply_async()
            got: list[bytes] = []
            while len(got) < n:
                item = client.blpop([key], timeout=GATHER_TIMEOUT)
                if item is None:
                    raise BenchError(f"raw Celery: {len(got)} of {n} tasks reported in time")
                got += [item[1], *(client.lpop(key, n) or [])]
            if sorted(int(v) for v in got) != list(range(n)):
                raise BenchError("raw Celery: tasks reported wrong or duplicate indexes")
        finally:
            client.delete(key)

    return run


def raw_celery_round_trips(app: Any, redis_url: str, n: int) -> Callable[[], None]:
    """``n`` raw tasks one after another: publish one, ``BLPOP`` its report, publish the next.

    The floor of a sequential step on a cluster: one Celery round trip (the same workers,
    task events on, as bulksync's app has them) with nothing of bulksync in it.
    """
    client = redis.Redis.from_url(redis_url)

    def run() -> None:
        key = f"bench:rt:{uuid.uuid4().hex}"
        try:
            for i in range(n):
                app.send_task(graphs.RAW_TASK, args=(redis_url, key, i))
                item = client.blpop([key], timeout=GATHER_TIMEOUT)
                if item is None or int(item[1]) != i:
                    raise BenchError(f"raw Celery round trip {i}: got {item!r}")
        finally:
            client.delete(key)

    return run


# -- sequential -------------------------------------------------------------------------


def sequential(graph: Any, steps: int, durability: str | None) -> Callable[[], None]:
    """One run of the loop graph on a new thread (so every run starts from no checkpoint)."""

    def run() -> None:
        config = graphs.loop_config(steps, f"bench-{uuid.uuid4().hex}")
        kw = {"durability": durability} if durability else {}
        out = graph.invoke(graphs.loop_input(steps), config, **kw)
        if out != {"i": steps, "n": steps}:
            raise BenchError(f"loop of {steps} steps ended with {out}")

    return run


@contextmanager
def paired_savers(database_url: str, tag: str) -> Iterator[tuple[Any, Any, str, str]]:
    """bulksync's and LangGraph's ``PostgresSaver``, each set up in a fresh schema of its
    own (dropped afterwards), with the URLs of those schemas."""
    from langgraph.checkpoint.postgres import PostgresSaver as LangGraphPostgresSaver

    from bulksync.checkpoint.postgres import PostgresSaver

    with (
        fresh_schema(database_url, f"bench_{tag}_bulksync") as bs_url,
        fresh_schema(database_url, f"bench_{tag}_langgraph") as lg_url,
        PostgresSaver.from_conn_string(bs_url) as saver,
        LangGraphPostgresSaver.from_conn_string(lg_url) as lg_saver,
    ):
        saver.setup()
        lg_saver.setup()
        yield saver, lg_saver, bs_url, lg_url


@contextmanager
def fresh_schema(database_url: str, name: str) -> Iterator[str]:
    """A URL whose ``search_path`` is a new schema ``name``, dropped afterwards."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in database_url else "?"
    try:
        yield f"{database_url}{sep}options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


# -- whole runs -------------------------------------------------------------------------


def line_runs(graph: Any, n: int) -> Callable[[], None]:
    """``n`` runs of the three-node line graph, one after another, each on a new thread."""

    def run() -> None:
        for _ in range(n):
            config = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex}"}}
            out = graph.invoke(graphs.LINE_INPUT, config)
            if out != graphs.LINE_OUTPUT:
                raise BenchError(f"line run ended with {out}")

    return run


def detached_line_runs(client: Any, graph_id: str, n: int, *, at_once: bool) -> Callable[[], None]:
    """``n`` line runs submitted to the coordinator service: each waited for before the next
    is submitted, or (``at_once``) all submitted, then all waited for."""

    def finish(run_id: str) -> None:
        run = client.wait(run_id, timeout=GATHER_TIMEOUT)
        if run.status != "success" or run.output != graphs.LINE_OUTPUT:
            raise BenchError(f"detached run {run_id}: {run.status}, {run.output!r} {run.error}")

    def submit() -> str:
        return str(client.submit(graph_id, graphs.LINE_INPUT, thread_id=uuid.uuid4().hex))

    def run() -> None:
        if not at_once:
            for _ in range(n):
                finish(submit())
            return
        for run_id in [submit() for _ in range(n)]:
            finish(run_id)

    return run


# -- checkpoint storage -----------------------------------------------------------------


def chat_thread(graph: Any, thread_id: str, messages: int) -> None:
    """Run the chat graph on ``thread_id`` to ``messages`` messages, a step each."""
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": messages + 5}
    out = graph.invoke({"messages": [], "n": messages}, config, durability="sync")
    if len(out["messages"]) != messages:
        raise BenchError(f"chat of {messages} messages ended with {len(out['messages'])}")


def thread_bytes(database_url: str, tables: Sequence[str], thread_id: str) -> int:
    """The bytes a thread's rows take in ``tables`` (``pg_column_size`` of each row)."""
    with psycopg.connect(database_url) as conn:
        return sum(
            conn.execute(
                f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t WHERE thread_id = %s",
                (thread_id,),
            ).fetchone()[0]
            for table in tables
        )


def read_state(graph: Any, thread_id: str, messages: int) -> Callable[[], None]:
    """One read of the thread's latest state, checked."""

    def run() -> None:
        values = graph.get_state({"configurable": {"thread_id": thread_id}}).values
        if len(values["messages"]) != messages:
            raise BenchError(f"the state read {len(values['messages'])} of {messages} messages")

    return run
