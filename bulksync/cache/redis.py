"""``RedisCache``: node results cached in Redis, shared by every process of a cluster.

With ``compile(cache=RedisCache())`` a coordinator (for node tasks) and every worker (for the
``@task`` calls its nodes make) read and fill the same entries, so a result computed by one
worker process is reused by any other, and by in-process runs pointed at the same Redis.
Values are stored encoded with bulksync's msgpack serde under
``<prefix><namespace>:<key>``, with Redis's own expiry for a policy's ``ttl``.

The cache only saves work: when Redis cannot be reached, a lookup is a miss and a result
that cannot be stored is not, each logged as a warning, and the run goes on. Clearing is
asked for explicitly, so its failure raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import redis as _redis

from bulksync.cache.base import BaseCache, FullKey, Namespace
from bulksync.checkpoint.serde import MsgpackSerde
from bulksync.redis_lean import LeanRedis

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "bulksync:cache:"

_GLOB_SPECIALS = "\\*?[]"
_CLEAR_BATCH = 500


class RedisCache(BaseCache):
    """Entries in Redis under ``prefix`` (caches sharing a Redis stay apart when neither's
    prefix starts with the other's).

    ``redis`` is a ``redis.Redis`` client (as LangGraph's ``RedisCache`` takes it) or a URL;
    by default the ``redis_url`` setting (``BULKSYNC_REDIS_URL``), connected on first use,
    so a graph module can build its cache at import without Redis being up.
    """

    def __init__(
        self, redis: _redis.Redis | str | None = None, *, prefix: str = DEFAULT_PREFIX
    ) -> None:
        if not prefix:
            raise ValueError(
                "RedisCache(prefix=''): give a prefix, such as 'myapp:cache:' (clearing "
                "the cache drops every key that starts with it)"
            )
        if isinstance(redis, _redis.Redis) and redis.get_connection_kwargs().get(
            "decode_responses"
        ):
            raise ValueError(
                "RedisCache(redis=...): the client decodes responses to text, and cached "
                "values are bytes; pass a client made without decode_responses=True"
            )
        self.prefix = prefix
        self._client = redis if isinstance(redis, _redis.Redis) else None
        self._url = redis if isinstance(redis, str) else None
        self._serde = MsgpackSerde()

    @property
    def client(self) -> _redis.Redis:
        """The Redis client (made from the URL on first use)."""
        if self._client is None:
            url = self._url
            if url is None:
                from bulksync.settings import env_setting

                url = env_setting("redis_url")
            self._client = LeanRedis.from_url(url, socket_connect_timeout=3)
        return self._client

    def get(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        """The values of those ``keys`` that have a live entry (none when Redis is down)."""
        keys = list(keys)
        if not keys:
            return {}
        try:
            found = cast(
                "list[bytes | None]", self.client.mget([self._key(ns, key) for ns, key in keys])
            )
        except _redis.RedisError as exc:
            log.warning("node cache: lookup in Redis failed, running the tasks instead: %s", exc)
            return {}
        return {k: self._serde.loads(v) for k, v in zip(keys, found, strict=True) if v is not None}

    def set(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        """Store each key's value for its time to live in seconds (None: no expiry)."""
        encoded = [
            (self._key(*k), self._serde.dumps(value), ttl) for k, (value, ttl) in pairs.items()
        ]
        if not encoded:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key, data, ttl in encoded:
                    pipe.set(key, data, px=None if ttl is None else max(1, round(ttl * 1000)))
                pipe.execute()
        except _redis.RedisError as exc:
            log.warning("node cache: storing %d result(s) in Redis failed: %s", len(encoded), exc)

    def clear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """Drop the entries of ``namespaces`` (None: every entry under this cache's prefix).

        Raises:
            redis.RedisError: Redis could not be reached.
        """
        patterns = (
            [_glob(self.prefix) + "*"]
            if namespaces is None
            else [_glob(f"{self.prefix}{_token(tuple(ns))}:") + "*" for ns in namespaces]
        )
        for pattern in patterns:
            for batch in _batches(self.client.scan_iter(match=pattern, count=_CLEAR_BATCH)):
                self.client.delete(*batch)

    def _key(self, ns: Namespace, key: str) -> str:
        return f"{self.prefix}{_token(ns)}:{key}"


def _token(ns: Namespace) -> str:
    """A namespace as one key segment: its parts escaped so it holds no ':' of its own."""
    return "/".join(quote(part, safe="") for part in ns)


def _glob(text: str) -> str:
    """``text`` matched literally by a Redis ``SCAN MATCH`` pattern."""
    return "".join(f"\\{c}" if c in _GLOB_SPECIALS else c for c in text)


def _batches(keys: Iterator[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for key in keys:
        batch.append(key)
        if len(batch) >= _CLEAR_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


__all__ = ["RedisCache"]
