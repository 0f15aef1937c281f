"""The commands that drive runs on the cluster: coordinator, submit, follow, runs, state, …

``coordinator`` is the service (``bulksync.service.coordinator``); the others are clients
(``bulksync.client``) and need a coordinator serving the graph to get an answer. Each lives in
its own module: ``submit`` (submit, resume), ``follow``, ``listing`` (runs, cancel) and
``reads`` (state, history). Values on the command line and in the output are JSON
(``inputs``, ``output``); the progress of a run is drawn by ``progress``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any, TextIO

from bulksync.cli import follow, listing, reads, submit
from bulksync.cli.listing import STATUSES
from bulksync.cli.output import to_json
from bulksync.cli.progress import progress_text
from bulksync.cli.setting_flags import add_setting_flags
from bulksync.cli.worker import (
    add_graph_option,
    announcer,
    check_broker,
    check_redis,
    load_registry,
    tune_gc,
)
from bulksync.logs import configure as configure_logging
from bulksync.settings import Settings

__all__ = ["STATUSES", "add_parsers", "progress_text", "run_coordinator", "to_json"]


def add_parsers(commands: Any) -> None:
    """Register the run commands."""
    _coordinator(commands)
    submit.add_parsers(commands)
    follow.add_parser(commands)
    listing.add_parsers(commands)
    reads.add_parsers(commands)


def _coordinator(commands: Any) -> None:
    parser = commands.add_parser(
        "coordinator",
        help="run the coordinator service: drive submitted runs on the workers",
        description="Claim runs of the graphs named by --graph from Postgres, drive each on "
        "the Celery workers, stream their events to Redis, and take over the runs of "
        "coordinators that stopped heartbeating. Start several for availability.",
    )
    add_graph_option(parser)
    add_setting_flags(parser, "coordinator")  # --max-runs, --heartbeat, …
    parser.add_argument(
        "--loglevel",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: %(default)s)",
    )
    parser.set_defaults(run=run_coordinator)


def run_coordinator(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Serve runs until interrupted."""
    from bulksync.service.coordinator import open_coordinator
    from bulksync.workers.celery.app import make_app

    configure_logging(settings.log_format, args.loglevel)
    registry = load_registry(args.graph)
    check_redis(settings.redis_url)
    app = make_app(settings)
    check_broker(app, settings.broker_url)
    tune_gc(settings)  # a run's state and a wide step's tasks are many objects too
    with open_coordinator(settings, registry, app=app) as coordinator:
        say = announcer(out, settings.log_format == "json")
        say(f"bulksync coordinator: graphs {', '.join(registry.ids())}")
        say(f"bulksync coordinator: {coordinator.owner}, up to {settings.max_runs} runs at once")
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (docker stop, kubectl): finish the runs in flight, then exit.
            stop = threading.Thread(target=coordinator.stop, daemon=True)

            def on_term(*_: Any) -> None:
                if stop.ident is None:  # a second SIGTERM changes nothing
                    stop.start()

            signal.signal(signal.SIGTERM, on_term)
        coordinator.serve()
    return 0
