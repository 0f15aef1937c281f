"""``bulksync worker``: a Celery worker that runs the node tasks of the graphs it loads."""

from __future__ import annotations

import argparse
import gc
import logging
from collections.abc import Callable
from typing import Any, TextIO

from bulksync.cli.setting_flags import add_setting_flags
from bulksync.errors import ServiceUnavailableError, UsageError
from bulksync.logs import configure as configure_logging
from bulksync.settings import Settings
from bulksync.urls import redact

POOLS = ("prefork", "threads", "solo")


def add_parser(commands: Any) -> None:
    """Register ``worker``."""
    worker = commands.add_parser(
        "worker",
        help="run a Celery worker for the node tasks of the given graphs",
        description=(
            "Start a Celery worker that runs node tasks of the graphs named by --graph. Only "
            "these graphs are imported, once, at start; a task naming any other graph is "
            "answered with an error. Tasks of nodes added with queue=NAME go to queue NAME."
        ),
    )
    add_graph_option(worker)
    worker.add_argument(
        "--queues",
        metavar="Q1,Q2",
        help="queues to consume, comma-separated (default: $BULKSYNC_QUEUE, i.e. bulksync)",
    )
    worker.add_argument(
        "--pool",
        choices=POOLS,
        default="prefork",
        help="prefork for CPU-bound nodes, threads for I/O-bound ones (default: %(default)s)",
    )
    worker.add_argument("--hostname", metavar="NAME", help="worker name shown in Flower")
    worker.add_argument(
        "--loglevel",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: %(default)s)",
    )
    add_setting_flags(worker, "worker")  # --concurrency, --state-cache-size, …
    worker.set_defaults(run=run_worker)


def add_graph_option(parser: argparse.ArgumentParser) -> None:
    """The ``--graph`` option shared by the processes that load graphs."""
    parser.add_argument(
        "--graph",
        action="append",
        required=True,
        metavar="pkg.module[:attr]",
        help="graph(s) to load: one attribute, or every compiled graph of a module; repeatable",
    )


def load_registry(refs: list[str]) -> Any:
    """Import the ``--graph`` references into a registry.

    Raises:
        UsageError: a reference that cannot be imported or names no compiled graph; a
            module whose own code fails as it is imported (its error in one line).
    """
    from bulksync.workers.registry import GraphRegistry

    registry = GraphRegistry()
    for ref in refs:
        try:
            registry.load(ref)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from exc
        except Exception as exc:  # the module's own code raised (a bug, a missing setting)
            module = ref.partition(":")[0]
            first = (str(exc).splitlines() or [""])[0]
            raise UsageError(
                f"--graph {ref!r}: importing module '{module}' failed: {type(exc).__name__}"
                f"{': ' + first if first else ''}; see the traceback with "
                f"python -c 'import {module}'"
            ) from exc
    return registry


def check_redis(url: str) -> None:
    """Raise ``ServiceUnavailableError`` (one line, URL named) unless Redis answers."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise ServiceUnavailableError(
            f"cannot reach Redis at {redact(url)} ({exc}); start it or set BULKSYNC_REDIS_URL"
        ) from None


def check_broker(app: Any, url: str) -> None:
    """Raise ``ServiceUnavailableError`` unless the broker accepts a connection."""
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:  # kombu raises transport-specific errors
        raise ServiceUnavailableError(
            f"cannot reach the broker at {redact(url)} ({exc}); start it or set BULKSYNC_BROKER_URL"
        ) from None


def run_worker(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Load the graphs, register one Celery task per node, and consume until stopped."""
    from bulksync.workers.celery.app import make_app
    from bulksync.workers.celery.node_task import WorkerRuntime, install

    json_lines = settings.log_format == "json"
    if json_lines:  # before Celery's setup, which then keeps this handler
        configure_logging(settings.log_format, args.loglevel)
    registry = load_registry(args.graph)
    check_redis(settings.redis_url)
    app = make_app(settings)
    check_broker(app, settings.broker_url)
    names = install(app, WorkerRuntime(registry, settings))
    tune_gc(settings)  # before the pool starts: its processes keep it
    queues = args.queues or settings.queue
    say = announcer(out, json_lines)
    say(f"bulksync worker: graphs {', '.join(registry.ids())}")
    say(f"bulksync worker: {len(names)} node tasks, queues {queues}")
    # --quiet: no banner, so that JSON logs are the only lines the worker writes.
    argv = ["--quiet"] if json_lines else []
    argv += ["worker", "--queues", queues, "--pool", args.pool, "--loglevel", args.loglevel]
    argv += ["--task-events", "--without-mingle", "--without-gossip"]
    if settings.concurrency:
        argv += ["--concurrency", str(settings.concurrency)]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    app.worker_main(argv)
    return 0


def tune_gc(settings: Settings) -> None:
    """Collect the oldest generation after ``full_gc_after`` collections of the middle one,
    and leave what the process loaded at start-up out of every later collection (a worker's
    or a ``bulksync coordinator``'s; never a program's that runs a graph itself).

    A full collection walks every live object, and a worker with thousands of async tasks in
    flight has many (10,000 async Sends x 1 s on two processes: about 3 s at Python's 10, 2 s
    at 100). Garbage in cycles that lived long is freed that much later. The modules, the
    graphs and Celery's app live as long as the process: frozen (``gc.freeze``), no collection
    walks them again (5-10% of the workers' CPU in that fan-out), and the processes a prefork
    pool forks share their pages instead of copying those a collection would touch.
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, settings.full_gc_after)
    gc.collect()  # start-up's own garbage is freed, not frozen
    gc.freeze()


def announcer(out: TextIO, json_lines: bool) -> Callable[[str], None]:
    """A start-up line's printer, or its logger when every line must be a JSON object."""
    if not json_lines:
        return lambda text: print(text, file=out, flush=True)
    return logging.getLogger("bulksync.cli").info
