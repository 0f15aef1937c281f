"""``python -m bench.load``: many runs submitted at once to one coordinator; none may be lost.

Starts ``--workers`` ``bulksync worker --graph bench.graphs:fanout`` processes (thread pools)
and one ``bulksync coordinator`` (with ``--max-runs`` when given, else its default) on a
private queue and a fresh Postgres schema, submits ``--runs`` runs of a ``--fanout``-way
fan-out as fast as the client can, and waits for all of them. It prints the command, how
many runs ended in each status, whether every output is right, the wall time, and — sampled
every 50 ms meanwhile — the most runs the coordinator had running at once and the most
threads its process had; it exits non-zero when a run did not succeed with the right output.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg

from bench import graphs
from bench.measure import fresh_schema
from bench.workers import REPO, Workers
from bulksync.client import Client
from bulksync.service import events, runs
from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app

GRAPH = "bench.graphs:fanout"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load figure; 0 when every run succeeded with the right output."""
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000, help="runs submitted at once")
    parser.add_argument("--fanout", type=int, default=3, help="Send tasks per run")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    parser.add_argument("--max-runs", type=int, default=None, help="the coordinator's")
    parser.add_argument("--timeout", type=float, default=600.0, help="longest wait, seconds")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env.setdefault("BULKSYNC_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    base = Settings.from_env(env)
    queue = f"bulksync-load-{uuid.uuid4().hex[:8]}"
    print("command:", shlex.join(["python", "-m", "bench.load", *(argv or sys.argv[1:])]))
    with fresh_schema(base.database_url, f"load_{uuid.uuid4().hex[:8]}") as url:
        settings = Settings.from_env({**env, "BULKSYNC_DATABASE_URL": url})
        settings = Settings(
            broker_url=settings.broker_url,
            redis_url=settings.redis_url,
            database_url=url,
            queue=queue,
        )
        app = make_app(settings)
        workers = Workers(
            settings,
            app,
            args.workers,
            graph_ref=GRAPH,
            concurrency=args.concurrency,
            pool="threads",
        )
        with workers, Client(settings) as client:
            script = Path(sys.executable).with_name("bulksync")  # the console script
            cmd = [str(script), "coordinator", "--graph", GRAPH]
            if args.max_runs is not None:
                cmd += ["--max-runs", str(args.max_runs)]
            proc_env = {
                **env,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                "BULKSYNC_QUEUE": queue,
                "BULKSYNC_DATABASE_URL": url,
            }
            log = Path(workers.log_dir) / "coordinator.log"
            with log.open("wb") as out:
                coordinator = subprocess.Popen(
                    cmd,
                    env=proc_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    start_new_session=True,
                )
            sampler = _Sampler(coordinator.pid, url)
            try:
                with sampler:
                    code = _measure(client, args, log)
                print(
                    f"at once: up to {sampler.running} runs running, "
                    f"the coordinator process up to {sampler.threads} threads"
                )
                return code
            finally:
                os.killpg(coordinator.pid, signal.SIGTERM)
                coordinator.wait(60)
                app.close()


class _Sampler:
    """The most runs running at once, and the most threads of process ``pid``, while open."""

    def __init__(self, pid: int, database_url: str) -> None:
        self.pid = pid
        self.url = database_url
        self.running = 0
        self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.05):
                try:
                    row = conn.execute(
                        "SELECT count(*) FROM bulksync_runs WHERE status = 'running'"
                    ).fetchone()
                except psycopg.errors.UndefinedTable:  # the coordinator has not made it yet
                    row = None
                self.running = max(self.running, row[0] if row else 0)
                for line in status.read_text().splitlines():
                    if line.startswith("Threads:"):
                        self.threads = max(self.threads, int(line.split()[1]))


def _measure(client: Client, args: argparse.Namespace, log: Path) -> int:
    deadline = time.monotonic() + 60
    while not events.serving(client.redis, GRAPH):  # the coordinator announces itself once up
        if time.monotonic() > deadline:
            raise SystemExit(f"no coordinator announced {GRAPH} within 60 s; see {log}")
        time.sleep(0.1)
    start = time.monotonic()
    ids = [client.submit(GRAPH, graphs.fanout_input(args.fanout)) for _ in range(args.runs)]
    submitted = time.monotonic() - start
    deadline = start + args.timeout
    statuses: collections.Counter[str] = collections.Counter()
    wrong = 0
    for run_id in ids:
        try:
            run = client.wait(run_id, timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            statuses["unfinished"] += 1
            continue
        statuses[run.status] += 1
        if run.status == runs.SUCCESS and run.output["out"] != list(range(args.fanout)):
            wrong += 1
    took = time.monotonic() - start
    print(f"runs: {args.runs} submitted in {submitted:.1f} s; all waited for in {took:.1f} s")
    print("statuses:", dict(statuses), f"wrong outputs: {wrong}")
    print("coordinator log:", log)
    return 0 if statuses[runs.SUCCESS] == args.runs and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
