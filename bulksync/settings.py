"""Process settings, read once from ``BULKSYNC_*`` environment variables at an entry point.

::

    variable                default                                 schemes accepted
    BULKSYNC_HOME           ~/.bulksync                             (a directory)
    BULKSYNC_BROKER_URL     redis://127.0.0.1:6379/0                redis rediss amqp amqps
    BULKSYNC_REDIS_URL      redis://127.0.0.1:6379/0                redis rediss unix
    BULKSYNC_DATABASE_URL   postgresql://127.0.0.1:5432/postgres    postgresql postgres
    BULKSYNC_QUEUE          bulksync                                the queue of nodes without
                                                                    ``queue=`` (a worker's default)
    BULKSYNC_TASK_TIMEOUT   (none)                                  seconds: default node timeout
    BULKSYNC_VISIBILITY_TIMEOUT  3600                               seconds before a Redis broker
                                                                    redelivers a message whose
                                                                    worker died unacknowledged

A variable that is set but empty counts as unset, so ``FOO=`` in a compose file or a shell
means "use the default". Nothing here reads the environment at import time: entry points call
:meth:`Settings.from_env` once and pass the result down.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

ENV_PREFIX: Final = "BULKSYNC_"

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
DEFAULT_VISIBILITY_TIMEOUT: Final = 3600.0

DEMO_DB_NAME: Final = "demo.sqlite"


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Where bulksync keeps local files and how it reaches its services; checked on creation.

    Raises:
        ValueError: naming the variable whose URL has a scheme bulksync cannot use.
    """

    home: Path = dataclasses.field(default_factory=lambda: Path(DEFAULT_HOME).expanduser())
    broker_url: str = DEFAULT_BROKER_URL
    redis_url: str = DEFAULT_REDIS_URL
    database_url: str = DEFAULT_DATABASE_URL
    queue: str = DEFAULT_QUEUE
    task_timeout: float | None = None
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT

    def __post_init__(self) -> None:
        check_url("BULKSYNC_BROKER_URL", self.broker_url, BROKER_SCHEMES, DEFAULT_BROKER_URL)
        check_url("BULKSYNC_REDIS_URL", self.redis_url, REDIS_SCHEMES, DEFAULT_REDIS_URL)
        check_url(
            "BULKSYNC_DATABASE_URL", self.database_url, DATABASE_SCHEMES, DEFAULT_DATABASE_URL
        )
        for name, value in (
            ("BULKSYNC_TASK_TIMEOUT", self.task_timeout),
            ("BULKSYNC_VISIBILITY_TIMEOUT", self.visibility_timeout),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r}: set it to a positive number of seconds.")

    def __repr__(self) -> str:
        # Hand-written so that passwords in URLs never reach a log through repr().
        return (
            f"Settings(home={str(self.home)!r}, broker_url={redact(self.broker_url)!r}, "
            f"redis_url={redact(self.redis_url)!r}, database_url={redact(self.database_url)!r}, "
            f"queue={self.queue!r}, task_timeout={self.task_timeout!r}, "
            f"visibility_timeout={self.visibility_timeout!r})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``environ`` (default: ``os.environ``, read at call time).

        Raises:
            ValueError: naming the variable whose URL has a scheme bulksync cannot use.
        """
        env = os.environ if environ is None else environ

        def get(name: str, default: str) -> str:
            return env.get(ENV_PREFIX + name) or default

        timeout = get("TASK_TIMEOUT", "")
        return cls(
            home=Path(get("HOME", DEFAULT_HOME)).expanduser(),
            broker_url=get("BROKER_URL", DEFAULT_BROKER_URL),
            redis_url=get("REDIS_URL", DEFAULT_REDIS_URL),
            database_url=get("DATABASE_URL", DEFAULT_DATABASE_URL),
            queue=get("QUEUE", DEFAULT_QUEUE),
            task_timeout=seconds("BULKSYNC_TASK_TIMEOUT", timeout) if timeout else None,
            visibility_timeout=seconds(
                "BULKSYNC_VISIBILITY_TIMEOUT",
                get("VISIBILITY_TIMEOUT", str(DEFAULT_VISIBILITY_TIMEOUT)),
            ),
        )

    @property
    def demo_db(self) -> Path:
        """The SQLite file ``bulksync demo`` checkpoints into unless told otherwise."""
        return self.home / DEMO_DB_NAME


def seconds(variable: str, text: str) -> float:
    """Parse a number of seconds from a variable.

    Raises:
        ValueError: naming the variable and what it should hold.
    """
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r}: set it to a number of seconds.") from None


def check_url(variable: str, url: str, schemes: tuple[str, ...], example: str) -> None:
    """Check that ``url`` starts with ``<scheme>://`` for one of ``schemes``.

    Raises:
        ValueError: naming ``variable``, the value (password hidden) and the accepted schemes.
    """
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in schemes:
        return
    found = f"scheme '{scheme}'" if scheme else "no '<scheme>://' prefix"
    accepted = ", ".join(f"{s}://" for s in schemes)
    raise ValueError(
        f"{variable}={redact(url)!r} has {found}; set it to a URL starting with one of "
        f"{accepted} (for example {example})"
    )


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, safe to put in a message or a log."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed netloc (bad port, bracket): show no part of it
        return "<unparsable URL>"
    if not password:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostinfo}").geturl()
