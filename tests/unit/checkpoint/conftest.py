"""The ``saver`` fixture: every saver the contract suite runs against.

To add a saver, add its name to ``SAVERS`` and a branch to ``saver`` (a saver that needs a
service should ``pytest.skip`` when it is missing, and fail when ``CI`` is set).

``postgres`` uses the database ``BULKSYNC_DATABASE_URL`` names (default: the local ``test``
database) with a fresh schema per test, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.checkpoint.sqlite import SqliteSaver

SAVERS = ["memory", "sqlite", "postgres"]

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=SAVERS)
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointSaver]:
    """A fresh, empty saver of each kind."""
    if request.param == "memory":
        yield InMemorySaver()
    elif request.param == "sqlite":
        with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as sqlite_saver:
            yield sqlite_saver
    elif request.param == "postgres":
        yield from _postgres_saver()
    else:
        raise AssertionError(f"no fixture branch for saver {request.param!r}")


def _postgres_saver() -> Iterator[PostgresSaver]:
    """A PostgresSaver on a fresh schema; skips (fails under ``CI``) without Postgres."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    url = os.environ.get("BULKSYNC_DATABASE_URL", DEFAULT_DATABASE_URL)
    schema = f"contract_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        message = f"Postgres is not reachable at {url} ({exc})".strip()
        if os.environ.get("CI"):
            pytest.fail(f"{message}; .ci/run should have started it", pytrace=False)
        pytest.skip(message)
    try:
        schema_url = make_conninfo(url, options=f"-c search_path={schema}")
        with PostgresSaver.from_conn_string(schema_url, max_size=8) as pg_saver:
            pg_saver.setup()
            yield pg_saver
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
