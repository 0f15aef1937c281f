"""A worker's link to the coordinator's saver, over real Redis: writes reach the run's saver
in order, reads come back as plain values, and a read nobody answers or a run without a
saver fails with an error saying so."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from bulksync import keys
from bulksync.checkpoint.base import Checkpoint, Encoded
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.errors import ConfigError
from bulksync.workers import wire
from bulksync.workers.celery import coordinator_saver
from bulksync.workers.celery.coordinator_saver import CoordinatorSaver, serve

THREAD = {"configurable": {"thread_id": "t", "checkpoint_ns": "node:1"}}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url)
    yield r
    r.close()


def _drain(r: redis.Redis, step_key: str, saver: InMemorySaver | None) -> int:
    """Serve every entry in the step's inbox, as the coordinator's gatherer does."""
    served = 0
    while (raw := r.lpop(keys.inbox(step_key))) is not None:
        assert isinstance(raw, bytes)
        key, entry = wire.address_of(raw)
        assert key == step_key
        serve(saver, r, entry[:1], entry[1:])
        served += 1
    return served


def _checkpoint(checkpoint_id: str, value: object) -> Checkpoint:
    return Checkpoint(1, checkpoint_id, "2026-11-25T00:00:00+00:00", {"a": value}, {"a": 1}, {})


def test_writes_reach_the_run_saver_and_read_back_plain(client: redis.Redis) -> None:
    step_key, saver = uuid.uuid4().hex, InMemorySaver()
    worker = CoordinatorSaver(client, step_key)
    config = worker.put(THREAD, _checkpoint("c1", {"x": 1}), {"step": 0}, {"a": 1})
    assert config["configurable"]["checkpoint_id"] == "c1"
    written = Encoded.of(wire.SERDE, ["already", "encoded"])  # a worker's write, as is
    worker.put_writes(config, [("a", written), ("__interrupt__", "why?")], "task-1")
    assert _drain(client, step_key, saver) == 2
    stored = saver.get_tuple(THREAD)
    assert stored is not None and stored.checkpoint.channel_values == {"a": {"x": 1}}

    answering = threading.Thread(target=_answer_once, args=(client, step_key, saver))
    answering.start()
    found = worker.get_tuple(THREAD)
    answering.join()
    assert found is not None
    assert found.checkpoint.channel_values == {"a": {"x": 1}}
    assert found.metadata["step"] == 0
    assert sorted(w[1:] for w in found.pending_writes) == [
        ("__interrupt__", "why?"),
        ("a", ["already", "encoded"]),
    ]
    assert not any(isinstance(w[2], Encoded) for w in found.pending_writes)


def _answer_once(r: redis.Redis, step_key: str, saver: InMemorySaver | None) -> None:
    popped = r.blpop([keys.inbox(step_key)], timeout=10)
    assert popped is not None
    key, entry = wire.address_of(popped[1])
    assert key == step_key
    serve(saver, r, entry[:1], entry[1:])


def test_a_listing_comes_back_newest_first(client: redis.Redis) -> None:
    step_key, saver = uuid.uuid4().hex, InMemorySaver()
    worker = CoordinatorSaver(client, step_key)
    first = worker.put(THREAD, _checkpoint("c1", 1), {}, {"a": 1})
    worker.put(first, _checkpoint("c2", 2), {}, {"a": 2})
    _drain(client, step_key, saver)
    answering = threading.Thread(target=_answer_once, args=(client, step_key, saver))
    answering.start()
    listed = list(worker.list(THREAD, limit=5))
    answering.join()
    assert [t.checkpoint.id for t in listed] == ["c2", "c1"]


def test_a_read_in_a_run_without_a_saver_fails_clearly(client: redis.Redis) -> None:
    step_key = uuid.uuid4().hex
    worker = CoordinatorSaver(client, step_key)
    answering = threading.Thread(target=_answer_once, args=(client, step_key, None))
    answering.start()
    with pytest.raises(ConfigError, match="no checkpointer"):
        worker.get_tuple(THREAD)
    answering.join()


def test_a_read_nobody_answers_times_out_naming_the_step(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator_saver, "QUERY_WAIT", 0.2)
    step_key = uuid.uuid4().hex
    with pytest.raises(TimeoutError, match=f"checkpoint read of step {step_key}"):
        CoordinatorSaver(client, step_key).get_tuple(THREAD)
    client.delete(keys.inbox(step_key))


def test_a_node_cannot_delete_the_thread(client: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="cannot delete thread 't'"):
        CoordinatorSaver(client, uuid.uuid4().hex).delete_thread("t")
