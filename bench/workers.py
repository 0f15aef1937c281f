"""The benchmark's worker processes: ``bulksync worker`` subprocesses on a private queue.

:class:`Workers` starts them in sessions of their own (so a Ctrl-C in the terminal reaches
only the bench, which then stops them in order), waits until each answers a Celery ``ping``,
and on exit asks each to shut down warm (``SIGTERM``), then kills what is left of its
process group — only the groups it started, by id.
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


def worker_command(graph_ref: str, hostname: str, concurrency: int, pool: str) -> list[str]:
    """``bulksync worker …``: the console script next to this interpreter, else ``-c main()``."""
    script = Path(sys.executable).parent / "bulksync"
    head = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from bulksync.cli import main; sys.exit(main())"]
    )
    return [
        *head,
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
    """Raised when a worker exits or does not answer a ping in time; holds its log's tail."""


class Workers:
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
        self.settings = settings
        self.app = app
        self.count = count
        self.graph_ref = graph_ref
        self.concurrency = concurrency
        self.pool = pool
        tag = uuid.uuid4().hex[:8]
        self.hostnames = [f"bench{i}-{tag}@%h" for i in range(count)]
        self.log_dir = Path(tempfile.mkdtemp(prefix="bulksync-bench-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    def command(self, index: int = 0) -> list[str]:
        """The command line of worker ``index``."""
        return worker_command(self.graph_ref, self.hostnames[index], self.concurrency, self.pool)

    def __enter__(self) -> Workers:
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
        """Start the workers and wait until every one answers a ping.

        Raises:
            WorkerStartError: a worker exited or did not answer within ``READY_TIMEOUT`` seconds
                (the message holds the end of its log).
        """
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["BULKSYNC_QUEUE"] = self.settings.queue
        env["BULKSYNC_BROKER_URL"] = self.settings.broker_url
        env["BULKSYNC_REDIS_URL"] = self.settings.redis_url
        for i in range(self.count):
            log = (self.log_dir / f"worker{i}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    self.command(i),
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        host = os.uname().nodename
        wanted = {h.replace("%h", host) for h in self.hostnames}
        deadline = time.monotonic() + READY_TIMEOUT
        seen: set[str] = set()
        while time.monotonic() < deadline:
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise WorkerStartError(
                        f"worker {i} exited with status {proc.returncode}:\n{self.log_tail(i)}"
                    )
            for reply in self.app.control.ping(destination=sorted(wanted), timeout=1.0) or []:
                seen.update(reply)
            if wanted <= seen:
                return
        missing = ", ".join(sorted(wanted - seen))
        raise WorkerStartError(
            f"workers {missing} did not answer a ping within {READY_TIMEOUT:g}s; "
            f"logs in {self.log_dir}"
        )

    def log_tail(self, index: int, lines: int = 20) -> str:
        """The last ``lines`` lines of worker ``index``'s log."""
        path = self.log_dir / f"worker{index}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Warm shutdown for each worker; kill the process group of any that hangs."""
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

    def describe(self) -> str:
        """One line: how many workers and the command of the first."""
        return f"{self.count} x `{shlex.join(self.command(0))}`"
