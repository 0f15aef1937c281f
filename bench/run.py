"""``python -m bench.run``: bulksync vs its baselines, measured in one run on the same workers.

Starts ``--workers`` ``bulksync worker --graph bench.graphs`` processes on a private queue and
measures, interleaving the contenders round by round:

1. a ``--fanout``-way trivial ``Send`` fan-out through bulksync (attached ``CeleryExecutor``,
   no checkpointer, and the same with a ``PostgresSaver`` in a fresh schema) vs a raw Celery
   ``group`` of as many tasks on the same workers vs in-process LangGraph (default settings,
   no checkpointer);
2. the per-step time of a ``--steps``-step sequential graph through bulksync (attached
   ``CeleryExecutor`` + bulksync ``PostgresSaver``, a durable commit each step) vs LangGraph
   with its ``PostgresSaver``, each saver in a fresh schema and each run on a fresh thread,
   and vs the floor: a raw Celery round trip on the same workers plus the commit's cost;
3. an ``--io``-way fan-out of tasks that wait ``--io-wait`` seconds (sync and async nodes)
   on ``--workers`` thread-pool workers of their own (``--io-concurrency`` threads each) vs
   in-process LangGraph (defaults, ``max_concurrency=100``, and async) and the physical
   limit of one task per pool thread;
4. whole runs of a three-node graph: ``--e2e`` runs one after another, attached
   (``CeleryExecutor`` + ``PostgresSaver``) and detached (``Client.submit`` + ``wait`` on a
   ``bulksync coordinator`` process) vs in-process LangGraph and vs the floor (three raw
   Celery round trips plus the commits' cost); then ``--runs`` runs submitted at once to
   the coordinator vs as many in-process LangGraph runs, in runs per second, with the CPU
   each contender's processes spend on a run (the database's and the broker's included)
   and the floor it implies: a raw Celery run's CPU plus the in-process loop's;
6. a ``--cpu``-way fan-out of tasks that each compute ``--cpu-work`` seconds of CPU, on the
   ``--workers`` prefork workers, vs in-process LangGraph (its threads share one GIL) and the
   physical limit of one task per worker process;
7. a wide fan-out: ``--wide`` async tasks that wait ``--wide-wait`` seconds (model calls), on
   part 3's workers, vs in-process LangGraph async;
5. checkpoint storage of a ``--chat``-message conversation (one 200-byte message a step,
   ``operator.add``, durability sync) in bulksync's ``PostgresSaver`` vs LangGraph's: the
   bytes the last step added, the bytes per step on average, and the time to read the
   latest state.

It prints the command to reproduce, the machine and its speed at the start and the end (an
empty loop, timed: the same hardware runs at different speeds at different times), every figure
and the ratios (of medians, with their range round by round), and stops the workers at the end,
on errors and on Ctrl-C. Service URLs come from ``BULKSYNC_*`` variables (the database defaults
to the local ``test`` database). A ``--fanout 0``, ``--steps 0``, ``--io 0``, ``--wide 0``,
``--e2e 0``, ``--cpu 0`` or ``--chat 0`` skips that part (``--runs 0`` part 4's second half).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from importlib import metadata
from typing import Any, Final

from bench.parts import (
    run_computing,
    run_end_to_end,
    run_fanout,
    run_sequential,
    run_storage,
    run_waiting,
    run_wide,
)
from bench.workers import Workers, WorkerStartError
from bulksync.errors import ServiceUnavailableError
from bulksync.settings import Settings
from bulksync.urls import redact

DEFAULT_DATABASE_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"
PACKAGES: Final = ("bulksync", "celery", "kombu", "redis", "psycopg", "langgraph")
PACKAGES_PG: Final = "langgraph-checkpoint-postgres"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])

    def count(text: str) -> int:
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
        return value

    parser.add_argument("--fanout", type=count, default=1000, help="Send tasks (default 1000)")
    parser.add_argument("--steps", type=count, default=100, help="sequential steps (default 100)")
    parser.add_argument("--workers", type=count, default=2, help="worker processes (default 2)")
    parser.add_argument("--repeat", type=count, default=5, help="timed runs each (default 5)")
    parser.add_argument("--warmup", type=count, default=1, help="untimed runs each (default 1)")
    parser.add_argument(
        "--io", type=count, default=1000, help="Send tasks that wait, part 3 (default 1000)"
    )
    parser.add_argument(
        "--io-wait", type=float, default=0.05, help="seconds each waits (default 0.05)"
    )
    parser.add_argument(
        "--io-concurrency",
        type=count,
        default=50,
        help="threads of each part-3 worker, --pool threads (default 50)",
    )
    parser.add_argument(
        "--wide",
        type=count,
        default=10_000,
        help="async Send tasks of the wide fan-out, part 7, on part 3's workers (default 10000)",
    )
    parser.add_argument(
        "--wide-wait", type=float, default=1.0, help="seconds each waits (default 1)"
    )
    parser.add_argument(
        "--e2e", type=count, default=20, help="whole runs one after another, part 4 (default 20)"
    )
    parser.add_argument(
        "--runs", type=count, default=200, help="runs submitted at once, part 4 (default 200)"
    )
    parser.add_argument(
        "--cpu", type=count, default=200, help="CPU-bound Send tasks, part 6 (default 200)"
    )
    parser.add_argument(
        "--cpu-work", type=float, default=0.02, help="CPU seconds of each (default 0.02)"
    )
    parser.add_argument(
        "--chat", type=count, default=500, help="messages of the conversation, part 5 (default 500)"
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeat < 1:
        parser.error("--workers and --repeat must be at least 1")
    return args


def bench_settings(environ: dict[str, str] | None = None) -> Settings:
    """``BULKSYNC_*`` settings with the local ``test`` database and a private queue."""
    env = dict(os.environ if environ is None else environ)
    env.setdefault("BULKSYNC_DATABASE_URL", DEFAULT_DATABASE_URL)
    settings = Settings.from_env(env)
    return dataclasses.replace(settings, queue=f"bench-{uuid.uuid4().hex[:8]}")


def reproduce(args: argparse.Namespace) -> str:
    """The command line that repeats this run, with any ``BULKSYNC_*`` URL it relied on."""
    env = [
        f"{name}={shlex.quote(redact(value))}"
        for name, value in sorted(os.environ.items())
        if name.endswith("_URL") and name.startswith("BULKSYNC_")
    ]
    flags = ["--fanout", args.fanout, "--steps", args.steps, "--workers", args.workers]
    flags += ["--repeat", args.repeat, "--warmup", args.warmup]
    flags += ["--io", args.io, "--io-wait", args.io_wait, "--io-concurrency", args.io_concurrency]
    flags += ["--wide", args.wide, "--wide-wait", args.wide_wait]
    flags += ["--e2e", args.e2e, "--runs", args.runs, "--chat", args.chat]
    flags += ["--cpu", args.cpu, "--cpu-work", args.cpu_work]
    return " ".join([*env, "python -m bench.run", *map(str, flags)])


def machine() -> list[str]:
    """Lines describing this machine and the versions measured."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = []
    for name in (*PACKAGES, PACKAGES_PG):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return [
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu})",
        f"python:  {platform.python_version()} ({sys.executable})",
        f"versions: {', '.join(versions)}",
    ]


def load() -> str:
    """The 1/5/15-minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


SPEED_STEPS: Final = 10_000_000
"""Steps of the loop that times this machine's Python speed (``speed``)."""


def speed(steps: int = SPEED_STEPS, tries: int = 3) -> str:
    """How fast this machine runs Python now: the quickest of ``tries`` timings of an empty
    ``steps``-step loop. The same hardware has run it in 0.19 s to 0.87 s on different days
    and hours. It is one sign of the machine's state, not all of it: round trips between
    processes have slowed by half while this loop ran at its quickest."""
    best = math.inf
    for _ in range(tries):
        began = time.perf_counter()
        for _ in range(steps):
            pass
        best = min(best, time.perf_counter() - began)
    return f"an empty {steps:,}-step Python loop took {best:.3f} s (quickest of {tries})"


def check_services(settings: Settings, app: Any, *, postgres: bool) -> None:
    """Raise ``ServiceUnavailableError`` (one line naming URL and variable) if a service is down."""
    import psycopg

    from bulksync.cli.worker import check_broker, check_redis

    check_redis(settings.redis_url)
    check_broker(app, settings.broker_url)
    if postgres:
        try:
            psycopg.connect(settings.database_url, connect_timeout=3).close()
        except psycopg.Error as exc:
            raise ServiceUnavailableError(
                f"cannot reach Postgres at {redact(settings.database_url)} "
                f"({' '.join(str(exc).split())}); start it "
                "or set BULKSYNC_DATABASE_URL"
            ) from None


def delete_queue(app: Any, queue: str) -> None:
    """Remove the private queue and any message left in it (after Ctrl-C) from the broker."""
    try:
        with app.connection_for_write() as conn:
            bound = app.amqp.queues[queue](conn.default_channel)
            # Declared first: kombu's Redis transport deletes only queues its channel has bound.
            bound.declare()
            bound.delete()
    except Exception as exc:  # the figures are printed already; say so and go on
        print(f"note: could not delete queue {queue} ({exc})", file=sys.stderr)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return 0, 2 (a service down, a worker not starting) or 130 (Ctrl-C)."""
    from bulksync.workers.celery.app import make_app

    args = parse_args(argv)
    settings = bench_settings()
    print(f"bulksync bench, {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"command: {reproduce(args)}   (from the repository root)")
    for line in machine():
        print(line)
    print(
        f"services: broker {redact(settings.broker_url)}, redis {redact(settings.redis_url)}, "
        f"postgres {redact(settings.database_url)}"
    )
    print(f"load average at start: {load()}")
    print(f"speed at start: {speed()}")
    app = make_app(settings)
    try:
        check_services(
            settings, app, postgres=bool(args.steps or args.fanout or args.e2e or args.chat)
        )
    except ServiceUnavailableError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with Workers(settings, app, args.workers) as workers:
            print(f"workers: {workers.describe()}")
            print(f"         queue {settings.queue}; the same processes serve every part")
            if args.fanout:
                run_fanout(args, settings, app)
            if args.steps:
                run_sequential(args, settings, app)
            if args.e2e:
                run_end_to_end(args, settings, app, workers)
            if args.cpu:
                run_computing(args, settings, app)
        if args.io or args.wide:
            waiting = dataclasses.replace(settings, queue=f"{settings.queue}-io")
            io_workers = Workers(
                waiting, app, args.workers, concurrency=args.io_concurrency, pool="threads"
            )
            try:
                with io_workers:
                    print(f"\nworkers for parts 3 and 7: {io_workers.describe()}")
                    if args.io:
                        run_waiting(args, waiting, app)
                    if args.wide:
                        run_wide(args, waiting, app)
            finally:
                delete_queue(app, waiting.queue)
        if args.chat:
            run_storage(args, settings)
    except WorkerStartError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: workers stopped", file=sys.stderr)
        return 130
    finally:
        delete_queue(app, settings.queue)
    print(f"\nload average at end: {load()}")
    print(f"speed at end: {speed()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
