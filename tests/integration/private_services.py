"""Private Redis and Postgres instances a fault test may stop and restart (never the shared).

``PrivatePostgres`` is a cluster made by ``initdb`` under a temporary directory, run by
``pg_ctl`` on a free port (as the ``postgres`` user when the tests run as root, which
``initdb`` refuses); ``PrivateRedis`` is a ``redis-server`` on a free port with its own
directory. Both skip the test (fail under ``CI``) when their binaries are missing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.conftest import require_service

START_WAIT = 30.0
"""Longest wait for a private server to accept connections."""


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class PrivatePostgres:
    """A throwaway Postgres cluster; ``stop()`` and ``start()`` it at will."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        require_service("Postgres binaries (initdb)", lambda: found[-1])
        self.bin = Path(found[-1]).parent
        self.root = Path(tempfile.mkdtemp(prefix="bulksync-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        subprocess.run(
            _as_postgres(
                [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"]
            ),
            check=True,
            capture_output=True,
        )
        self.start()

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            _as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), *args]),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-l", str(self.log), "-o", options, "-w", "-t", str(int(START_WAIT)), "start")

    def stop(self) -> None:
        """Stop it at once (``immediate``: connections drop as in a crash)."""
        self._ctl("-m", "immediate", "-w", "stop")

    def close(self) -> None:
        """Stop it if running and remove its files."""
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A throwaway ``redis-server``; ``restart()`` keeps its data (saved on shutdown)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        require_service("redis-server", lambda: binary or _missing("redis-server"))
        self.binary = str(binary)
        self.dir = Path(tempfile.mkdtemp(prefix="bulksync-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Start the server on its port and wait for a PING."""
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--dir", str(self.dir), "--save", "", "--appendonly", "no"]
        with (self.dir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        with redis.Redis(port=self.port, socket_connect_timeout=1) as client:
            deadline = time.monotonic() + START_WAIT
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def stop(self) -> None:
        """Save the data set and shut down (what a restart of a persistent Redis does)."""
        with (
            redis.Redis(port=self.port) as client,
            contextlib.suppress(redis.ConnectionError),  # it drops the connection as it exits
        ):
            client.shutdown(save=True)
        if self.proc is not None:
            self.proc.wait(START_WAIT)
            self.proc = None

    def close(self) -> None:
        """Stop it and remove its files."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _missing(name: str) -> str:
    raise FileNotFoundError(f"{name} is not installed")
