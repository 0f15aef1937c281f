"""Process settings: every tunable, declared once as a field of :class:`Settings`.

A field's declaration (``declaration.setting``) is all there is to a setting:

- its **name** gives the environment variable (``max_runs`` → ``BULKSYNC_MAX_RUNS``) and, for
  the ``coordinator`` and ``worker`` groups, the flag of ``bulksync coordinator`` /
  ``bulksync worker`` (``--max-runs``; a flag overrides the variable);
- its **annotation** gives the type (``str``, ``int``, ``float``, ``Path``; ``| None`` when
  unset has a meaning of its own, told by the help);
- its **metadata** gives the group, the unit, the one-line help and, for a URL, the schemes
  bulksync can use.

Groups: ``cluster`` (every process: where the services are, the default queue, how long Redis
keeps what it holds), ``coordinator`` (a process that drives runs and dispatches their tasks,
including a program running a graph on a ``CeleryExecutor``), ``worker`` (a process that runs
node tasks). :func:`declarations` lists them for the command line, the README check and
``repr``; ``README.md``'s Configuration table shows them all (a test keeps it true).

A variable that is set but empty counts as unset, so ``FOO=`` in a compose file or a shell
means "use the default". Nothing here reads the environment at import time: entry points call
:meth:`Settings.from_env` once and pass the result down. Every bad value raises
:class:`~bulksync.errors.ConfigError` naming the variable (or the flag) and what to set.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from bulksync.declaration import Declaration, Group, read_declarations, setting
from bulksync.errors import ConfigError

DEFAULT_HOME: Final = "~/.bulksync"
DEFAULT_BROKER_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL: Final = "postgresql://127.0.0.1:5432/postgres"

# Celery reaches its broker through kombu: Redis or RabbitMQ (AMQP).
BROKER_SCHEMES: Final = ("redis", "rediss", "amqp", "amqps")
REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
# psycopg accepts both spellings of a libpq connection URI.
DATABASE_SCHEMES: Final = ("postgresql", "postgres")

DEFAULT_QUEUE: Final = "bulksync"
LOG_FORMATS: Final = ("text", "json")
"""Values of ``log_format``: lines for people, or one JSON object per line for collectors."""
DEFAULT_VISIBILITY_TIMEOUT: Final = 3600.0

DEMO_DB_NAME: Final = "demo.sqlite"

DAY: Final = 24 * 3600


def _home() -> Path:
    return Path(DEFAULT_HOME).expanduser()


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Every tunable of bulksync and how it reaches its services; checked on creation.

    Raises:
        ConfigError: naming the variable whose value bulksync cannot use, and what to set.
    """

    # -- cluster: every process ----------------------------------------------------------
    # setting() returns a dataclasses.Field, which ruff cannot see (RUF009).
    home: Path = setting(  # noqa: RUF009
        group="cluster",
        doc="local files; `bulksync demo` writes demo.sqlite here",
        unit="directory",
        shown=DEFAULT_HOME,
        factory=_home,
    )
    broker_url: str = setting(
        DEFAULT_BROKER_URL, group="cluster", doc="Celery's broker", schemes=BROKER_SCHEMES
    )
    redis_url: str = setting(
        DEFAULT_REDIS_URL,
        group="cluster",
        doc="step state, task results, run streams",
        schemes=REDIS_SCHEMES,
    )
    database_url: str = setting(
        DEFAULT_DATABASE_URL,
        group="cluster",
        doc="checkpoints, runs, leases",
        schemes=DATABASE_SCHEMES,
    )
    queue: str = setting(
        DEFAULT_QUEUE,
        group="cluster",
        doc="the queue of nodes without queue=, and the one a worker consumes by default",
        unit="queue name",
    )
    strict: bool = setting(
        False,
        group="cluster",
        doc="compile graphs with bulksync's stricter checks (as compile(strict=True)): an update "
        "key outside the schema, a goto or Send to an unknown node and an unreachable node "
        "raise instead of being skipped with a warning, as LangGraph does",
        unit="1 or 0",
        shown="0",
    )
    task_timeout: float | None = setting(
        group="cluster",
        doc="time limit of any node task on a cluster worker, sync nodes included (the "
        "backstop behind an async node's own timeout=)",
        unit="seconds",
        shown="none",
    )
    visibility_timeout: float = setting(
        DEFAULT_VISIBILITY_TIMEOUT,
        group="cluster",
        doc="before a Redis broker redelivers a message whose worker died unacknowledged",
        unit="seconds",
    )
    step_ttl: int = setting(
        DAY,
        group="cluster",
        doc="how long a step's state and inbox outlive a coordinator that died mid-step",
        unit="seconds",
    )
    result_ttl: int = setting(
        DAY,
        group="cluster",
        doc="how long a task's result is kept for a restarted coordinator to collect, when "
        "its step's checkpoint is not committed (a committed step's results are deleted)",
        unit="seconds",
    )
    run_ttl: int = setting(
        7 * DAY,
        group="cluster",
        doc="how long a run's stream, cancel flag and set of live steps outlive its last write",
        unit="seconds",
    )
    claim_lease: float = setting(
        20.0,
        group="cluster",
        doc="how long a task's claim outlives the last heartbeat of the worker running it; "
        "then the coordinator dispatches the task again",
        unit="seconds",
    )
    claim_heartbeat: float = setting(
        5.0,
        group="cluster",
        doc="how often a worker renews the claims of the tasks it runs, and a coordinator "
        "looks for lost ones (at most a third of the claim lease)",
        unit="seconds",
    )
    cancel_poll: float = setting(
        0.25,
        group="cluster",
        doc="how often a worker looks whether the steps and runs of its running tasks were "
        "cancelled, to stop their async nodes",
        unit="seconds",
    )
    max_deliveries: int = setting(
        3,
        group="cluster",
        doc="times a task may start and lose its worker before it fails with WorkerLostError",
        unit="deliveries",
    )
    unstarted_grace: float = setting(
        60.0,
        group="cluster",
        doc="how long a published task may wait unstarted before it is published again "
        "(doubling each time)",
        unit="seconds",
    )
    stream_wait: float = setting(
        2.0,
        group="cluster",
        doc="longest wait of a client for a run's next event before it checks the run's row",
        unit="seconds",
    )
    runs_pool_size: int = setting(
        4,
        group="cluster",
        doc="Postgres connections a client keeps for the runs table",
        unit="connections",
    )
    log_format: str = setting(
        "text",
        group="cluster",
        doc="how `bulksync worker` and `bulksync coordinator` write log lines: text, or json "
        "(one JSON object per line)",
        unit="log format",
    )
    retry_window: float = setting(
        60.0,
        group="cluster",
        doc="how long a call to Redis or Postgres that failed for a lost connection is retried, "
        "with backoff, before it fails",
        unit="seconds",
    )

    # -- coordinator: drives runs, dispatches tasks ------------------------------------------
    max_runs: int = setting(
        100, group="coordinator", doc="runs one coordinator process drives at once", unit="runs"
    )
    drive_threads: int = setting(
        8,
        group="coordinator",
        doc="threads a coordinator moves its runs on with (applying writes, committing, "
        "dispatching); a run waiting on its tasks holds none",
        unit="threads",
    )
    heartbeat: float = setting(
        5.0,
        group="coordinator",
        doc="how often a coordinator says it is alive and renews its thread leases",
        unit="seconds",
    )
    stale_after: float | None = setting(
        group="coordinator",
        doc="silence after which a coordinator's runs and leases go to another one",
        unit="seconds",
        shown="3 heartbeats",
    )
    poll_interval: float = setting(
        2.0,
        group="coordinator",
        doc="longest wait for work before looking at the runs table again",
        unit="seconds",
    )
    progress_interval: float = setting(
        0.2,
        group="coordinator",
        doc="time between two progress events of one step",
        unit="seconds",
    )
    queue_wait_warning: float = setting(
        30.0,
        group="coordinator",
        doc="how long a step's tasks may wait on a queue with no worker taking one before the "
        "coordinator's log and the run's progress say which queue and how many tasks",
        unit="seconds",
    )
    db_pool_size: int | None = setting(
        group="coordinator",
        doc="Postgres connections of a coordinator, for checkpoints, leases and runs",
        unit="connections",
        shown="max runs (up to 32) + 4",
    )
    redis_pool_size: int | None = setting(
        group="coordinator",
        doc="Redis connections of a coordinator; a call finding all busy waits for one",
        unit="connections",
        shown="max runs + 8",
    )
    target_messages: int = setting(
        32,
        group="coordinator",
        doc="a node's Send fan-out is split into about this many messages",
        unit="messages",
    )
    max_batch: int = setting(
        64, group="coordinator", doc="most tasks of a sync node one message carries", unit="tasks"
    )
    max_async_batch: int = setting(
        256,
        group="coordinator",
        doc="most tasks of an async node one message carries (a worker runs them all at once "
        "on its event loop)",
        unit="tasks",
    )
    max_merged: int = setting(
        8,
        group="coordinator",
        doc="most runs whose one-task messages of a node share a message when their steps are "
        "published at the same moment (1: never shared)",
        unit="runs",
    )
    drain_size: int = setting(
        1000,
        group="coordinator",
        doc="most reports read from an executor's inbox in one Redis call",
        unit="reports",
    )
    reconnect_wait: float = setting(
        0.5,
        group="coordinator",
        doc="pause before the gatherer reconnects to Redis",
        unit="seconds",
    )
    idle_wait: float = setting(
        2.0,
        group="coordinator",
        doc="longest block on a quiet inbox before checking timeouts and lost keys; keep it "
        "below Redis' 5 s socket timeout",
        unit="seconds",
    )

    # -- worker: runs node tasks -----------------------------------------------------------
    concurrency: int | None = setting(
        group="worker",
        doc="messages of node tasks one worker runs at once (its pool size; the tasks of "
        "one message may run at once too: --task-threads)",
        unit="tasks",
        shown="the number of CPUs",
    )
    state_cache_size: int = setting(
        16,
        group="worker",
        doc="step states a worker process keeps decoded for the step's next tasks",
        unit="step states",
    )
    task_threads: int = setting(
        256,
        group="worker",
        doc="threads of a worker process that run the sync tasks of its messages at once, once "
        "one of them took --parallel-after waiting (async tasks all run at once on the "
        "process's event loop); 1 runs every message's tasks one by one",
        unit="threads",
    )
    parallel_after: float = setting(
        0.005,
        group="worker",
        doc="how long a sync task of a message may take, mostly waiting, before the message's "
        "other tasks run at once rather than one by one",
        unit="seconds",
    )
    events_hold: float = setting(
        0.1,
        group="worker",
        doc="how long a worker holds the task events it sends for Flower, to send those of "
        "every task in that time as one message (Celery sends each at its loop's next turn)",
        unit="seconds",
    )
    full_gc_after: int = setting(
        100,
        group="worker",
        doc="collections of the middle garbage generation of a worker process (and of "
        "`bulksync coordinator`) between two full ones, which walk every live object: "
        "thousands of async tasks in flight make them the largest cost of a wide fan-out "
        "(Python's own: 10)",
        unit="collections",
    )

    # -- api: the HTTP API (`bulksync api`) -------------------------------------------------
    api_keys: str | None = setting(
        group="api",
        doc="keys an HTTP client must send as x-api-key, comma-separated; none: no key is "
        "asked for, and `bulksync api` listens on loopback only unless given --insecure",
        unit="keys",
        shown="none",
        secret=True,
    )
    api_max_body: int = setting(
        16 * 1024 * 1024,
        group="api",
        doc="largest request body the HTTP API reads; a larger one is refused with 413",
        unit="bytes",
    )
    api_retry_window: float = setting(
        5.0,
        group="api",
        doc="how long the HTTP API retries a lost Postgres before it answers 503",
        unit="seconds",
    )

    def __post_init__(self) -> None:
        for declared in declarations():
            declared.check(getattr(self, declared.name), declared.env)
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"BULKSYNC_LOG_FORMAT={self.log_format!r}: set it to one of "
                f"{', '.join(LOG_FORMATS)} (default: text)."
            )
        if self.stale_after is not None and not self.stale_after > self.heartbeat:
            raise ConfigError(
                f"BULKSYNC_STALE_AFTER (--stale-after) is {self.stale_after:g} s, not more than "
                f"the heartbeat ({self.heartbeat:g} s): set it to a few heartbeats, or unset "
                "it for 3."
            )

    def __repr__(self) -> str:
        # Hand-written so that passwords in URLs never reach a log through repr().
        shown = ", ".join(f"{d.name}={d.show(getattr(self, d.name))!r}" for d in declarations())
        return f"Settings({shown})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``environ`` (default: ``os.environ``, read at call time).

        Raises:
            ConfigError: naming the variable whose value bulksync cannot use.
        """
        env = os.environ if environ is None else environ
        given = {d.name: d.parse(text, d.env) for d in declarations() if (text := env.get(d.env))}
        return cls(**given)

    @property
    def demo_db(self) -> Path:
        """The SQLite file ``bulksync demo`` checkpoints into unless told otherwise."""
        return self.home / DEMO_DB_NAME

    @property
    def api_key_set(self) -> frozenset[str]:
        """The keys of ``api_keys`` (blanks around and between commas dropped)."""
        return frozenset(k.strip() for k in (self.api_keys or "").split(",") if k.strip())

    @property
    def lease_ttl(self) -> float:
        """Seconds a silent coordinator keeps its runs and thread leases (``stale_after``)."""
        return self.stale_after if self.stale_after is not None else 3 * self.heartbeat

    @property
    def claim_interval(self) -> float:
        """Seconds between two claim heartbeats: ``claim_heartbeat``, at most a third of the
        lease, so that two beats may fail before a live worker's claim expires."""
        return min(self.claim_heartbeat, self.claim_lease / 3)

    @property
    def db_connections(self) -> int:
        """The size of a coordinator's Postgres pool (``db_pool_size``).

        By default one connection per run it drives, up to 32 (runs share connections
        beyond that, and only ``drive_threads`` of them commit at once, besides subgraph
        nodes' child loops), plus a few for claiming, heartbeats and leases.
        """
        if self.db_pool_size is not None:
            return self.db_pool_size
        return min(self.max_runs, 32) + 4

    @property
    def redis_connections(self) -> int:
        """The size of a coordinator's Redis pool (``redis_pool_size``).

        By default one per run it drives (its events, its subgraph nodes' child loops and
        callbacks may each hold one a moment) plus a few for the shared gatherer, wake-ups
        and heartbeats; connections open only when used.
        """
        if self.redis_pool_size is not None:
            return self.redis_pool_size
        return self.max_runs + 8


def env_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One setting from ``environ`` (default: ``os.environ``), or its default: for a caller
    that needs just that one and must not fail on another variable it does not use.

    Raises:
        ConfigError: naming the variable, when its value is not one the setting takes.
    """
    declared = next(d for d in declarations() if d.name == name)
    text = (os.environ if environ is None else environ).get(declared.env)
    return declared.parse(text, declared.env) if text else declared.default


@functools.cache
def declarations(group: Group | None = None) -> tuple[Declaration, ...]:
    """Every setting in declaration order, or those of one ``group``."""
    return read_declarations(Settings, group)
