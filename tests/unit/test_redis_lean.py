"""The lean Redis client answers as redis-py does, and keeps its connections well."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from bulksync.redis_lean import LeanRedis
from bulksync.retry import redis_client


@pytest.fixture
def names(redis_client: redis.Redis) -> Iterator[str]:
    """A key prefix of the test's own; its keys are deleted after it."""
    prefix = f"test-lean:{uuid.uuid4().hex}:"
    yield prefix
    for key in redis_client.scan_iter(f"{prefix}*"):
        redis_client.delete(key)


@pytest.fixture
def lean(redis_url: str) -> Iterator[redis.Redis]:
    client = redis_client(redis_url, 4)
    yield client
    client.close()


def fill(pipe: Any, p: str) -> list[Any]:
    pipe.set(f"{p}a", "1")
    pipe.set(f"{p}a", "2", nx=True)  # a None reply, from a callback of its own
    pipe.hset(f"{p}h", mapping={"x": b"\x00\xff", "y": "z"})
    pipe.hmget(f"{p}h", ["x", "y", "missing"])
    pipe.mget([f"{p}a", f"{p}none"])
    pipe.exists(f"{p}a", f"{p}none")
    pipe.expire(f"{p}a", 60)
    pipe.eval("return {KEYS[1], ARGV[1], 3}", 1, f"{p}k", "v")
    pipe.rpush(f"{p}l", "e1", "e2")
    pipe.blmpop(1, 1, f"{p}l", direction="LEFT", count=5)
    pipe.hgetall(f"{p}h")
    result: list[Any] = pipe.execute()
    return result


def test_replies_are_redis_pys(lean: redis.Redis, redis_client: redis.Redis, names: str) -> None:
    expected = fill(redis_client.pipeline(transaction=False), f"{names}stock:")
    got = fill(lean.pipeline(transaction=False), f"{names}lean:")
    renamed = [
        [x.replace(b"stock", b"lean") if isinstance(x, bytes) else x for x in r]
        if isinstance(r, list)
        else r
        for r in expected
    ]
    assert got == renamed
    assert lean.get(f"{names}lean:a") == b"1"
    assert lean.hmget(f"{names}none", ["x"]) == [None]
    assert lean.set(f"{names}lean:a", "3", nx=True) is None
    assert lean.exists(f"{names}lean:a") == 1
    assert lean.blmpop(0.05, 1, f"{names}empty", direction="LEFT") is None


def test_commands_hiredis_does_not_pack_go_redis_pys_way(
    lean: redis.Redis, redis_client: redis.Redis, names: str
) -> None:
    lean.set(f"{names}b", bytearray(b"\x00\x01"))  # redis-py copies it to bytes first
    assert lean.get(f"{names}b") == b"\x00\x01"
    lean.set(f"{names}m", memoryview(b"\x02"))
    assert lean.get(f"{names}m") == b"\x02"
    # A name of two words, split by redis-py.
    assert lean.execute_command("CLIENT SETNAME", "lean") == redis_client.execute_command(
        "CLIENT SETNAME", "stock"
    )
    with pytest.raises(redis.DataError) as stock:
        redis_client.set(f"{names}n", None)  # type: ignore[arg-type]
    with pytest.raises(redis.DataError, match=re.escape(str(stock.value))):
        lean.set(f"{names}n", None)  # type: ignore[arg-type]
    assert lean.set(f"{names}n", 1.5) and lean.get(f"{names}n") == b"1.5"


def test_a_transaction_answers_as_redis_pys(
    lean: redis.Redis, redis_client: redis.Redis, names: str
) -> None:
    def transaction(client: redis.Redis, p: str) -> list[Any]:
        client.set(f"{p}s", "text")
        pipe = client.pipeline()
        pipe.incr(f"{p}n")
        pipe.incr(f"{p}s")  # refused when EXEC runs it: the others still run
        pipe.hset(f"{p}h", "f", "v")
        pipe.hgetall(f"{p}h")
        replies: list[Any] = pipe.execute(raise_on_error=False)
        return [type(r) if isinstance(r, Exception) else r for r in replies]

    assert transaction(lean, f"{names}lean:") == transaction(redis_client, f"{names}stock:")
    pipe = lean.pipeline()
    pipe.incr(f"{names}lean:s")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        pipe.execute()
    pipe.set(f"{names}x", "1")
    assert pipe.execute() == [True]


def test_a_watched_transaction_goes_redis_pys_way(lean: redis.Redis, names: str) -> None:
    with lean.pipeline() as pipe:
        pipe.watch(f"{names}w")
        lean.set(f"{names}w", "changed")  # another client's write, after the WATCH
        pipe.multi()
        pipe.set(f"{names}w", "mine")
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert lean.get(f"{names}w") == b"changed"
    assert lean.get(f"{names}w") == b"changed", "the connection that watched is clean"


def test_a_refused_command_of_a_pipeline(lean: redis.Redis, names: str) -> None:
    lean.set(f"{names}s", "text")
    pipe = lean.pipeline(transaction=False)
    pipe.incr(f"{names}s")  # not a number
    pipe.set(f"{names}t", "1")
    with pytest.raises(redis.ResponseError, match=r"Command # 1 \(INCRBY .*\) of pipeline"):
        pipe.execute()
    assert lean.get(f"{names}t") == b"1", "the rest of the pipeline ran, and was read"
    pipe.incr(f"{names}s")
    pipe.get(f"{names}t")
    refused, value = pipe.execute(raise_on_error=False)
    assert isinstance(refused, redis.ResponseError)
    assert value == b"1"
    assert lean.get(f"{names}t") == b"1", "no reply left unread on the connection"


def test_a_refused_command_leaves_its_connection_clean(lean: redis.Redis, names: str) -> None:
    lean.set(f"{names}s", "text")
    with pytest.raises(redis.ResponseError):
        lean.incr(f"{names}s")
    assert lean.get(f"{names}s") == b"text"
    assert lean.client_id() == lean.client_id(), "the connection was kept"


def test_a_broken_connection_is_replaced(
    lean: redis.Redis, redis_client: redis.Redis, names: str
) -> None:
    lean.set(f"{names}a", "1")
    first = lean.client_id()
    redis_client.client_kill_filter(_id=first)
    assert lean.get(f"{names}a") == b"1", "redis-py's path took over, and retried"
    pipe = lean.pipeline(transaction=False)
    pipe.get(f"{names}a")
    redis_client.client_kill_filter(_id=lean.client_id())
    assert pipe.execute() == [b"1"]
    assert lean.client_id() != first


def _child_id(url: str, client: redis.Redis, out: Any) -> None:
    out.put(client.client_id())
    client.close()


def test_a_forked_process_opens_its_own_connections(lean: redis.Redis, redis_url: str) -> None:
    parent = lean.client_id()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_id, args=(redis_url, lean, out))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert out.get(timeout=5) != parent
    assert lean.client_id() == parent, "the parent's connection is still its own"


def connections(observer: redis.Redis, name: str) -> int:
    return sum(1 for c in observer.client_list() if c.get("name") == name)


def closed(observer: redis.Redis, name: str) -> bool:
    """Whether the server has dropped every connection named ``name``: it sees a socket
    closed on its next turn, so this looks again for up to 5 s (a liveness bound)."""
    deadline = time.monotonic() + 5
    while connections(observer, name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_at_most_the_pools_size_are_open_and_closed_with_it(
    redis_url: str, redis_client: redis.Redis, names: str
) -> None:
    name = f"lean-{uuid.uuid4().hex[:8]}"
    client = redis_client_named(redis_url, name, 2)
    barrier = threading.Barrier(4)
    most: list[int] = []

    def wait() -> None:
        barrier.wait()
        client.blpop([f"{names}never"], timeout=0.3)
        most.append(connections(redis_client, name))

    threads = [threading.Thread(target=wait) for _ in range(4)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - began >= 0.55, "two of the four waited for a connection"
    assert max(most) <= 2
    assert connections(redis_client, name) == 2
    client.close()
    assert closed(redis_client, name)


def test_a_call_finding_every_connection_busy_waits_then_fails(redis_url: str, names: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=0.2)
    client = LeanRedis.from_pool(pool)
    busy = threading.Thread(target=client.blpop, args=([f"{names}never"],), kwargs={"timeout": 1})
    busy.start()
    time.sleep(0.1)
    began = time.monotonic()
    with pytest.raises(redis.ConnectionError, match="all 1 Redis connections"):
        client.get(f"{names}a")
    assert 0.15 <= time.monotonic() - began < 0.9
    busy.join()
    assert client.get(f"{names}a") is None, "the connection given back serves the next call"
    client.close()


def redis_client_named(url: str, name: str, size: int) -> redis.Redis:
    sep = "&" if "?" in url else "?"
    return redis_client(f"{url}{sep}client_name={name}", size)
