"""The benchmark's processes: ``bulksync worker`` and ``bulksync coordinator`` subprocesses.

:class:`Workers` starts workers on a private queue, :class:`CoordinatorProcess` a coordinator
serving the bench's graphs from a schema of its own. Both start them in sessions of their own
(so a Ctrl-C in the terminal reaches only the bench, which then stops them in order), wait
until they are ready (workers answer a Celery ``ping``; a coordinator announces its graphs),
and on exit ask each to shut down warm (``SIGTERM``), then kill what is left of its process
group — only the groups they started, by id.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from bulksync.settings import Settings

REPO: Final = Path(__file__).resolve().parent.parent
READY_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 20.0


def bulksync_command() -> list[str]:
    """``bulksync``: the console script next to this interpreter, else ``-c main()``."""
    script = Path(sys.executable).parent / "bulksync"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from bulksync.cli import main; sys.exit(main())"]


def worker_command(graph_ref: str, hostname: str, concurrency: int, pool: str) -> list[str]:
    """``bulksync worker …`` serving ``graph_ref`` under ``hostname``."""
    return [
        *bulksync_command(),
        "worker",
        "--graph",
        graph_ref,
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--hostname",
        hostname,
        "--loglevel",
        "WARNING",
    ]


class WorkerStartError(RuntimeError):
    """Raised when a process exits or is not ready in time; holds its log's tail."""


class Processes:
    """Subprocesses of the bench, each in a session of its own, with a log file each."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.log_dir = Path(tempfile.mkdtemp(prefix="bulksync-bench-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Any:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the processes and wait until they are ready (``WorkerStartError`` if not)."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The environment of a process: the repository importable, the bench's services."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["BULKSYNC_QUEUE"] = self.settings.queue
        env["BULKSYNC_BROKER_URL"] = self.settings.broker_url
        env["BULKSYNC_REDIS_URL"] = self.settings.redis_url
        return env

    def spawn(self, command: list[str], env: dict[str, str]) -> None:
        """Start ``command``, its output to the next log file."""
        log = (self.log_dir / f"process{len(self.procs)}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()

    def check_alive(self) -> None:
        """Raise ``WorkerStartError`` with its log if a process exited."""
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise WorkerStartError(
                    f"process {i} exited with status {proc.returncode}:\n{self.log_tail(i)}"
                )

    def log_tail(self, index: int, lines: int = 20) -> str:
        """The last ``lines`` lines of process ``index``'s log."""
        path = self.log_dir / f"process{index}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Warm shutdown for each process; kill the process group of any that hangs."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Still running, so not reaped: its pid is still its process group's id,
                # which its pool children share.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []


class Workers(Processes):
    """``count`` worker processes serving ``graph_ref`` on ``settings.queue``."""

    def __init__(
        self,
        settings: Settings,
        app: Any,
        count: int,
        *,
        graph_ref: str = "bench.graphs",
        concurrency: int = 1,
        pool: str = "prefork",
    ) -> None:
        super().__init__(settings)
        self.app = app
        self.count = count
        self.graph_ref = graph_ref
        self.concurrency = concurrency
        self.pool = pool
        tag = uuid.uuid4().hex[:8]
        self.hostnames = [f"bench{i}-{tag}@%h" for i in range(count)]

    def command(self, index: int = 0) -> list[str]:
        """The command line of worker ``index``."""
        return worker_command(self.graph_ref, self.hostnames[index], self.concurrency, self.pool)

    def start(self) -> None:
        """Start the workers and wait until every one answers a ping.

        Raises:
            WorkerStartError: a worker exited or did not answer within ``READY_TIMEOUT`` seconds
                (the message holds the end of its log).
        """
        env = self.environment()
        for i in range(self.count):
            self.spawn(self.command(i), env)
        host = os.uname().nodename
        wanted = {h.replace("%h", host) for h in self.hostnames}
        deadline = time.monotonic() + READY_TIMEOUT
        seen: set[str] = set()
        while time.monotonic() < deadline:
            self.check_alive()
            for reply in self.app.control.ping(destination=sorted(wanted), timeout=1.0) or []:
                seen.update(reply)
            if wanted <= seen:
                return
        missing = ", ".join(sorted(wanted - seen))
        raise WorkerStartError(
            f"workers {missing} did not answer a ping within {READY_TIMEOUT:g}s; "
            f"logs in {self.log_dir}"
        )

    def describe(self) -> str:
        """One line: how many workers and the command of the first."""
        return f"{self.count} x `{shlex.join(self.command(0))}`"


class CoordinatorProcess(Processes):
    """One ``bulksync coordinator`` serving ``graph_ref``'s graphs from ``database_url``."""

    def __init__(
        self, settings: Settings, database_url: str, *, graph_ref: str = "bench.graphs"
    ) -> None:
        super().__init__(settings)
        self.database_url = database_url
        self.graph_ref = graph_ref

    def command(self) -> list[str]:
        """The coordinator's command line."""
        return [
            *bulksync_command(),
            "coordinator",
            "--graph",
            self.graph_ref,
            "--loglevel",
            "WARNING",
        ]

    def start(self) -> None:
        """Start the coordinator and wait until it announces ``graph_ref:line``.

        Raises:
            WorkerStartError: it exited or did not announce within ``READY_TIMEOUT`` seconds.
        """
        from bulksync.retry import redis_client
        from bulksync.service.events import serving

        env = self.environment()
        env["BULKSYNC_DATABASE_URL"] = self.database_url
        self.spawn(self.command(), env)
        client = redis_client(self.settings.redis_url, 1)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while time.monotonic() < deadline:
                self.check_alive()
                if serving(client, f"{self.graph_ref}:line"):
                    return
                time.sleep(0.1)  # a start-up wait, not a poll of the measured work
        finally:
            client.close()
        raise WorkerStartError(
            f"the coordinator did not announce its graphs within {READY_TIMEOUT:g}s; "
            f"log in {self.log_dir}"
        )

    def describe(self) -> str:
        """The coordinator's command line."""
        return f"`{shlex.join(self.command())}`"
