"""``bulksync api``: the HTTP API LangGraph's clients speak (``bulksync.service.api``)."""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any, TextIO

from bulksync.cli.setting_flags import add_setting_flags
from bulksync.cli.worker import add_graph_option, announcer, check_redis, load_registry
from bulksync.errors import UsageError
from bulksync.logs import configure as configure_logging
from bulksync.settings import Settings

DEFAULT_PORT = 8123
"""The port LangGraph's clients try when given no URL."""


def add_parser(commands: Any) -> None:
    """Register ``api``."""
    parser = commands.add_parser(
        "api",
        help="serve the HTTP API (LangGraph's Agent Server API) for the given graphs",
        description="Serve LangGraph's Agent Server REST API over the cluster: assistants (the "
        "graphs named by --graph), threads, runs and their streams, for langgraph-sdk, "
        "RemoteGraph(url=...) and any HTTP client. Runs are driven by `bulksync coordinator`; "
        "the API itself only queues, reads and streams. OpenAPI: /docs.",
    )
    add_graph_option(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="listen on a non-loopback address with no API key set (BULKSYNC_API_KEYS): "
        "anyone who reaches the port can run graphs",
    )
    parser.add_argument(
        "--loglevel",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: %(default)s)",
    )
    add_setting_flags(parser, "api")  # --api-max-body, …
    parser.set_defaults(run=run_api)


def run_api(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Serve the API until interrupted."""
    import uvicorn

    from bulksync.service.api.app import create_app

    if not settings.api_key_set and not _loopback(args.host) and not args.insecure:
        raise UsageError(
            f"--host {args.host} with no API key: set BULKSYNC_API_KEYS (clients send one as "
            "x-api-key), or pass --insecure to serve it open"
        )
    configure_logging(settings.log_format, args.loglevel)
    registry = load_registry(args.graph)
    check_redis(settings.redis_url)
    app = create_app(settings, registry)
    say = announcer(out, settings.log_format == "json")
    say(f"bulksync api: graphs {', '.join(registry.ids())}")
    keys = "x-api-key required" if settings.api_key_set else "no API key"
    say(f"bulksync api: http://{args.host}:{args.port} ({keys}; OpenAPI at /docs, runs at /ui)")
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False)
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only localhost is known to stay on this machine
        return False
