"""The ``saver`` fixture: every saver the contract suite runs against.

To add a saver, add its name to ``SAVERS`` and a branch to ``saver`` (a saver that needs a
service should ``pytest.skip`` when it is missing, and fail when ``CI`` is set).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bulksync.checkpoint.base import CheckpointSaver
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.checkpoint.sqlite import SqliteSaver

SAVERS = ["memory", "sqlite"]


@pytest.fixture(params=SAVERS)
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointSaver]:
    """A fresh, empty saver of each kind."""
    if request.param == "memory":
        yield InMemorySaver()
    elif request.param == "sqlite":
        with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as sqlite_saver:
            yield sqlite_saver
    else:
        raise AssertionError(f"no fixture branch for saver {request.param!r}")
