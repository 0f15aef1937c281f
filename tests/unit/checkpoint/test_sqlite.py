"""What only SqliteSaver has: migrations, WAL, connections it did not open, query counts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bulksync.checkpoint import sqlite as sqlite_module
from bulksync.checkpoint.base import Checkpoint
from bulksync.checkpoint.sqlite import MIGRATIONS, SqliteSaver
from bulksync.coordinator.clock import checkpoint_id


def thread(thread_id: str = "t1") -> dict[str, object]:
    return {"configurable": {"thread_id": thread_id}}


def put_steps(saver: SqliteSaver, steps: int, thread_id: str = "t1") -> None:
    config = thread(thread_id)
    for step in range(steps):
        checkpoint = Checkpoint(
            v=4,
            id=checkpoint_id(step),
            ts="2024-01-01T00:00:00+00:00",
            channel_values={"a": step, "b": "same"},
            channel_versions={"a": step + 1, "b": 1},
            versions_seen={},
        )
        config = saver.put(config, checkpoint, {"step": step}, {"a": step + 1, "b": 1})
        saver.put_writes(config, [("a", step)], f"task-{step}")


def applied(conn: sqlite3.Connection) -> list[int]:
    return [row[0] for row in conn.execute("SELECT v FROM checkpoint_migrations ORDER BY v")]


def test_setup_applies_every_migration_once(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite")
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
        saver.setup()
        assert applied(saver.conn) == list(range(len(MIGRATIONS)))
        put_steps(saver, 2)
    with SqliteSaver.from_conn_string(path) as reopened:
        reopened.setup()
        assert applied(reopened.conn) == list(range(len(MIGRATIONS)))
        assert len(list(reopened.list(thread()))) == 2


def test_setup_applies_only_missing_migrations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "db.sqlite")
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:2])
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
        assert applied(saver.conn) == [0, 1]
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS)
    with SqliteSaver.from_conn_string(path) as saver:
        put_steps(saver, 1)  # first use runs setup() by itself
        assert applied(saver.conn) == list(range(len(MIGRATIONS)))


def test_file_database_uses_wal(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        put_steps(saver, 1)
        assert saver.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_in_memory_database(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(":memory:") as saver:
        put_steps(saver, 3)
        assert len(list(saver.list(None))) == 3


def test_connection_in_default_transaction_mode(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / "db.sqlite"), check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        put_steps(saver, 2)
        assert not conn.in_transaction
    finally:
        conn.close()
    with SqliteSaver.from_conn_string(str(tmp_path / "db.sqlite")) as reopened:
        latest = reopened.get_tuple(thread())
        assert latest is not None
        assert latest.checkpoint.channel_values == {"a": 1, "b": "same"}


def test_failed_put_rolls_back(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        put_steps(saver, 1)
        checkpoint = Checkpoint(4, checkpoint_id(1), "", {"a": 1}, {"a": 9}, {})
        saver.conn.execute(
            "CREATE TRIGGER fail BEFORE INSERT ON checkpoints BEGIN "
            "SELECT RAISE(ABORT, 'refused'); END"
        )
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            saver.put(thread(), checkpoint, {}, {"a": 9})
        blobs = saver.conn.execute("SELECT count(*) FROM checkpoint_blobs WHERE version = 9")
        assert blobs.fetchone()[0] == 0
        assert not saver.conn.in_transaction


def test_unchanged_channels_add_no_rows(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        put_steps(saver, 5)
        rows = dict(
            saver.conn.execute("SELECT channel, count(*) FROM checkpoint_blobs GROUP BY channel")
        )
        assert rows == {"a": 5, "b": 1}


def test_list_reads_pages_not_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_module, "PAGE_SIZE", 10)
    with SqliteSaver.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        put_steps(saver, 25)
        put_steps(saver, 5, "t2")
        selects: list[str] = []
        saver.conn.set_trace_callback(
            lambda sql: selects.append(sql) if sql.lstrip().startswith("SELECT") else None
        )
        listed = list(saver.list(None))
        assert len(listed) == 30
        assert all(len(t.pending_writes) == 1 for t in listed)
        assert all(t.checkpoint.channel_values["b"] == "same" for t in listed)
        # Three pages of 10 (checkpoints, blobs, writes each) and one empty page at most.
        assert len(selects) <= 3 * 3 + 1
