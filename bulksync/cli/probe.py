"""``bulksync probe``: is this container's bulksync process alive? For Docker's HEALTHCHECK and
Kubernetes' exec probes.

Each role is checked by what it does, not by its process existing:

- ``coordinator``: a coordinator of this host has an announcement of the graphs it serves
  still in force (its heartbeat thread renews it every heartbeat; it lasts ``stale_after``,
  and at least ``ANNOUNCED_AT_LEAST`` seconds, so a stopped heartbeat fails this soon after);
- ``worker``: a Celery worker of this host answers a ping sent over the broker;
- ``api``: ``GET /ok`` on its port; ``flower``: ``GET /healthcheck`` on its port.

Without a role the probe reads it, and the port, from the command line of process 1 — the
container's own command (``bulksync coordinator --graph …``) — so one ``HEALTHCHECK`` serves
the image whatever it runs; a container running anything else (``bulksync --help``) passes.
Exit 0: alive; 1: not, with one line saying why.
"""

from __future__ import annotations

import argparse
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from bulksync.settings import Settings
from bulksync.urls import redact

ROLES: Final = ("coordinator", "worker", "api", "flower")
DEFAULT_PORTS: Final = {"api": 8123, "flower": 5555}
MAIN_COMMAND: Final = Path("/proc/1/cmdline")
"""The container's main process's command line (NUL-separated)."""
TIMEOUT: Final = 3.0


def add_parser(commands: Any) -> None:
    """Register ``probe``."""
    parser = commands.add_parser(
        "probe",
        help="check that this container's bulksync process is alive (for health probes)",
        description="Check that a bulksync coordinator, worker, api or flower of this host is "
        "alive: exit 0 if so, 1 (with the reason) if not. Without ROLE, the role and its port "
        "come from the container's command (process 1).",
    )
    parser.add_argument("role", nargs="?", choices=ROLES, help="what to check (default: guess)")
    parser.add_argument("--port", type=int, help="the api's or Flower's port (default: guess)")
    parser.set_defaults(run=run_probe)


def run_probe(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """Probe, print one line, return 0 (alive) or 1."""
    role, port = args.role, args.port
    if role is None:
        role, found_port = role_of(_main_command())
        port = port or found_port
        if role is None:
            print(
                "bulksync probe: the container runs no bulksync service; nothing to check", file=out
            )
            return 0
    problem = _check(role, port or DEFAULT_PORTS.get(role, 0), settings)
    if problem:
        print(f"bulksync probe: {role} not alive: {problem}", file=out)
        return 1
    print(f"bulksync probe: {role} alive", file=out)
    return 0


def role_of(argv: Sequence[str]) -> tuple[str | None, int | None]:
    """The bulksync role a command line runs, and the port it names (``--port N``,
    ``--port=N``), if any."""
    role = None
    for i, arg in enumerate(argv):
        if Path(arg).name == "bulksync" or (arg == "-m" and argv[i + 1 : i + 2] == ["bulksync"]):
            rest = [a for a in argv[i + 1 :] if a != "bulksync"]
            role = next((a for a in rest[:1] if a in ROLES), None)
            argv = rest
            break
    if role is None:
        return None, None
    port = None
    for i, arg in enumerate(argv):
        text = arg.partition("=")[2] if arg.startswith("--port=") else None
        if arg == "--port" and i + 1 < len(argv):
            text = argv[i + 1]
        if text and text.isdigit():
            port = int(text)
    return role, port


def _main_command() -> list[str]:
    try:
        raw = MAIN_COMMAND.read_bytes()
    except OSError:  # not Linux, or no /proc: nothing to guess from
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _check(role: str, port: int, settings: Settings) -> str | None:
    """What is wrong with ``role`` on this host, or None when it is alive."""
    if role == "coordinator":
        return _coordinator(settings)
    if role == "worker":
        return _worker(settings)
    path = "/ok" if role == "api" else "/healthcheck"
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
            return None if answer.status == 200 else f"{url} answered {answer.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"


def _coordinator(settings: Settings) -> str | None:
    import redis

    from bulksync import keys

    host = socket.gethostname()
    try:
        client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=TIMEOUT)
        with client:
            seconds, micros = client.time()
            now = seconds + micros / 1e6
            for key in client.scan_iter(match=keys.served("*"), count=100):
                live = client.zrangebyscore(key, now, "+inf")
                owners = [m.decode() if isinstance(m, bytes) else str(m) for m in live]
                if any(owner.startswith(f"{host}:") for owner in owners):
                    return None
    except redis.RedisError as exc:
        return f"cannot reach Redis at {redact(settings.redis_url)} ({exc})"
    return f"no coordinator of host {host} has announced its graphs lately"


def _worker(settings: Settings) -> str | None:
    from bulksync.workers.celery.app import make_app

    host = socket.gethostname()
    app = make_app(settings)
    try:
        replies = app.control.ping(timeout=TIMEOUT) or []
    except Exception as exc:  # kombu raises transport-specific errors
        return f"cannot reach the broker at {redact(settings.broker_url)} ({exc})"
    names = [name for reply in replies for name in reply]
    if any(name.endswith(f"@{host}") for name in names):
        return None
    return f"no worker of host {host} answered a ping ({len(names)} others did)"
