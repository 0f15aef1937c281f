"""Append-only channel values stored as what each version appended (``delta``).

A chat's message list grows by a message or two a step. Storing the whole list again at each
new version makes a thread's checkpoints quadratic in its length, and so does encoding it.
When a channel's new value is its last stored value with items appended (the same objects,
in order), the ledger stores only the new items, marked with the version they extend. A
reader rebuilds the value by following that chain back to a full value (``Chains``).

The whole list is stored again when its length reaches a power of two from ``SNAPSHOT_FROM``
on. A read then follows at most about half the list's length of deltas, and the bytes stored
per step stay a few items on average, however long the thread.

A delta's bytes are ``0xC1`` (a byte msgpack never writes: no whole value is mistaken for
one), the base version as 8 big-endian bytes (so a database can follow the chain without
decoding, ``pg_migrations.CHAIN_SQL``), then the serde's encoding of the appended items.
Deltas are only written for values of bulksync's msgpack format (``MsgpackSerde``), whose
bytes can never start so. Values are compared by identity: an item changed in place after it
was stored is not stored again (state values are meant to be replaced, not mutated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from bulksync.checkpoint.base import Serde
from bulksync.errors import CheckpointError

MARK: Final = b"\xc1"
"""The first byte of a delta's bytes (never the first byte of a msgpack value)."""

SNAPSHOT_FROM: Final = 64
"""The list length from which a full value is stored at each power of two."""

FORMAT: Final = "bulksync-msgpack"
"""The serde format deltas are written for (``MsgpackSerde.format``)."""

Fetch = Callable[[str, str, str, int], Mapping[int, bytes | None]]
"""``(thread, ns, channel, version)`` → the stored versions of that channel that ``version``'s
chain needs (or more: every version), with their bytes."""


def appended(before: Sequence[Any] | None, value: Any) -> list[Any] | None:
    """The items ``value`` adds after ``before`` (the items of the stored value it follows),
    or ``None`` when ``value`` must be stored whole: not a list, not an append, or a length
    where a full value is due."""
    if before is None or type(value) is not list or len(value) <= len(before):
        return None
    size = len(before)
    if any(old is not new for old, new in zip(before, value[:size], strict=True)):
        return None
    if len(value) >= SNAPSHOT_FROM and len(value).bit_length() > size.bit_length():
        return None
    return value[size:]


def delta(serde: Serde, base: int, items: list[Any]) -> bytes | None:
    """The bytes storing ``items`` appended to the channel's value at version ``base``; None
    when ``serde`` does not write bulksync's msgpack (then the value is stored whole)."""
    if getattr(serde, "format", None) != FORMAT:
        return None
    return MARK + base.to_bytes(8, "big", signed=True) + serde.dumps(items)


def is_delta(blob: bytes | None) -> bool:
    """Whether stored bytes are a delta (``delta``) rather than a whole value."""
    return blob is not None and blob[:1] == MARK


Stored = dict[tuple[str, str, str], dict[int, bytes | None]]
"""``(thread, ns, channel)`` → stored versions of that channel, with their bytes."""


class Chains:
    """Whole values from stored bytes, deltas included, for one read.

    A version a chain needs is looked up in ``stored`` (what the read fetched with its
    checkpoints), else fetched with the rest of its chain (``fetch``), once per read; each
    version is rebuilt once; every call gets a list of its own. The versions of one chain are
    prefixes of one another, so they share one list: a version is that list's first items
    (its length kept), and a chain of N deltas is rebuilt in O(N) items, not O(N²), with one
    decoding call.
    """

    def __init__(self, serde: Serde, fetch: Fetch, stored: Stored | None = None) -> None:
        self.serde = serde
        self._fetch = fetch
        self._stored: Stored = stored if stored is not None else {}
        # (channel, version) -> (a list whose first ``length`` items are its value, length)
        self._built: dict[tuple[str, str, str, int], tuple[list[Any], int]] = {}

    def stored(self, thread: str, ns: str, channel: str, version: int) -> bytes | None:
        """The bytes of ``channel`` at ``version`` that this read holds (None: none, or the
        channel is empty there)."""
        return self._stored.get((thread, ns, channel), {}).get(version)

    def value(self, thread: str, ns: str, channel: str, version: int, blob: bytes) -> Any:
        """The value stored as ``blob`` for ``channel`` at ``version``.

        Raises:
            CheckpointError: a version the chain needs is not stored (the thread's rows were
                changed outside bulksync).
        """
        if not is_delta(blob):
            return self.serde.loads(blob)
        key = (thread, ns, channel)
        path: list[tuple[int, bytes]] = []  # (version, its items' bytes), newest first
        data: bytes | None = blob
        stored = self._stored.setdefault(key, {})
        built = self._built
        while data is not None and data[:1] == MARK:
            if (thread, ns, channel, version) in built:
                break
            base = int.from_bytes(data[1:9], "big", signed=True)
            path.append((version, data[9:]))
            if base not in stored:
                stored.update(self._fetch(*key, base))
            if stored.get(base) is None:
                raise CheckpointError(
                    f"thread {thread!r}: channel {channel!r} at version {version} extends "
                    f"version {base}, which is not stored; the thread's checkpoint rows were "
                    "changed outside bulksync"
                )
            version, data = base, stored[base]
        known = self._built.get((*key, version))
        if known is None:
            assert data is not None
            whole = list(self.serde.loads(data))
            known = self._built[(*key, version)] = (whole, len(whole))
        shared, length = known
        if path:
            if len(shared) != length:  # a branch grew it past this version: fork it
                shared = shared[:length]
            path.reverse()  # oldest first
            joined = _array(len(path)) + b"".join(items for _, items in path)
            for (newer, _), items in zip(path, self.serde.loads(joined), strict=True):
                shared.extend(items)  # appending keeps every older version a prefix
                length = len(shared)
                self._built[(*key, newer)] = (shared, length)
        return shared[:length]


def _array(size: int) -> bytes:
    """The msgpack header of an array of ``size`` items: the encoded item lists of a chain's
    deltas, joined after it, decode in one call as the list of those lists."""
    if size < 16:
        return bytes([0x90 | size])
    if size < 2**16:
        return b"\xdc" + size.to_bytes(2, "big")
    return b"\xdd" + size.to_bytes(4, "big")
