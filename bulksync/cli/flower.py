"""``bulksync flower``: Flower, the Celery monitor, built on bulksync's own Celery app.

Flower started as ``celery --broker=… flower`` runs on a default Celery app, which sends its
remote-control requests (the workers list, the queues a worker consumes) as JSON; bulksync
workers accept msgpack only, so they refuse each request with a logged traceback and Flower
shows no workers and no bulksync queue. Built on ``make_app(settings)`` instead, Flower speaks
the workers' serializer, reads the broker from ``BULKSYNC_BROKER_URL`` and sees the default
queue; task events (JSON, which Celery's event receiver always accepts) show the node tasks.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from bulksync.cli.worker import check_broker
from bulksync.settings import Settings


def add_parser(commands: Any) -> None:
    """Register ``flower``; every argument after it goes to Flower unchanged."""
    parser = commands.add_parser(
        "flower",
        help="run Flower on bulksync's Celery app: workers, queues and node tasks",
        description=(
            "Start Flower (the Celery monitor) on the broker of BULKSYNC_BROKER_URL, with the "
            "serializers bulksync workers accept. Every argument is one of Flower's options "
            "(--port=5555, --basic-auth=user:password, …; FLOWER_* variables work too); "
            "`bulksync flower --help` lists them."
        ),
        # Flower's options start with "-": with another prefix, argparse hands them all over.
        prefix_chars="+",
        add_help=False,
    )
    parser.add_argument(
        "options", nargs=argparse.REMAINDER, metavar="FLOWER_OPTION", help="Flower's options"
    )
    parser.set_defaults(run=run_flower)


def run_flower(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Serve Flower until stopped; its exit code."""
    from bulksync.workers.celery.app import make_app

    app = make_app(settings)
    check_broker(app, settings.broker_url)
    code = app.start(["flower", *args.options])
    return code if isinstance(code, int) else 0
