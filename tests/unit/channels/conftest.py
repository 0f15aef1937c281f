"""Shared helpers for the channel tests: replaying operations and checking stored data.

``trace`` replays a list of operations on a channel and records, after each, what it returned
and what the channel then shows (``get``, ``is_available``, ``checkpoint``). Operations:
``("update", [values])``, ``("consume",)``, ``("finish",)``, ``("restore",)`` (rebuild from
``checkpoint()``), ``("copy",)`` and ``("stored",)`` (rebuild from the checkpoint after a trip
through bulksync's msgpack serde, which a LangGraph channel skips). Running the same
operations on a bulksync channel and on its LangGraph twin and comparing the traces is the
differential check every channel test uses.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from langgraph._internal._typing import MISSING as LG_MISSING

from bulksync.channels.base import MISSING

EMPTY = "<empty>"
"""Stands for a ``get()`` that raised ``EmptyChannelError`` or a ``MISSING`` checkpoint."""

Op = tuple[Any, ...]
Trace = list[tuple[Any, ...]]
Tracer = Callable[..., Trace]

PLAIN_LEAVES = (str, bytes, int, float, bool, type(None))


def _normalise(value: Any) -> Any:
    """The value with either library's ``MISSING`` as ``EMPTY``, deep-copied against aliasing."""
    if value is MISSING or value is LG_MISSING:
        return EMPTY
    return copy.deepcopy(value)


def _observe(channel: Any) -> tuple[Any, bool, Any]:
    """``(get(), is_available(), checkpoint())`` with empties normalised."""
    try:
        got = _normalise(channel.get())
    except Exception as exc:  # both libraries' EmptyChannelError
        assert type(exc).__name__ == "EmptyChannelError"
        got = EMPTY
    return got, channel.is_available(), _normalise(channel.checkpoint())


def _apply(channel: Any, op: Op, convert: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Run one operation; return ``(result, channel)`` as the channel may be replaced."""
    name = op[0]
    if name == "update":
        return channel.update([convert(v) for v in op[1]]), channel
    if name == "consume":
        return channel.consume(), channel
    if name == "finish":
        return channel.finish(), channel
    if name == "restore":
        return None, channel.from_checkpoint(channel.checkpoint())
    if name == "copy":
        return None, channel.copy()
    if name == "stored":
        return None, channel.from_checkpoint(_through_storage(channel))
    raise AssertionError(f"unknown op {op!r}")


def _through_storage(channel: Any) -> Any:
    """The channel's checkpoint after a msgpack round trip (LangGraph's: unchanged)."""
    stored = channel.checkpoint()
    if stored is MISSING or not type(channel).__module__.startswith("bulksync."):
        return stored
    from bulksync.checkpoint.serde import MsgpackSerde

    serde = MsgpackSerde()
    return serde.loads(serde.dumps(stored))


def _trace(channel: Any, ops: list[Op], convert: Callable[[Any], Any] = lambda v: v) -> Trace:
    """Replay ``ops`` on ``channel``; one entry per op, stopping at the first error."""
    out: Trace = [("start", None, _observe(channel))]
    for op in ops:
        try:
            result, channel = _apply(channel, op, convert)
        except Exception as exc:
            out.append((op[0], "raised", type(exc).__name__))
            break
        out.append((op[0], result, _observe(channel)))
    return out


@pytest.fixture
def trace() -> Tracer:
    """``trace(channel, ops, convert=identity)``: the replay function described above."""
    return _trace


def _is_plain(value: Any, user_types: tuple[type, ...]) -> bool:
    """Whether ``value`` is built only from builtin containers, scalars and ``user_types``."""
    if isinstance(value, PLAIN_LEAVES + user_types):
        return True
    if type(value) in (list, tuple, set, frozenset):
        return all(_is_plain(item, user_types) for item in value)
    if type(value) is dict:
        return all(_is_plain(k, user_types) and _is_plain(v, user_types) for k, v in value.items())
    return False


@pytest.fixture
def is_plain() -> Callable[..., bool]:
    """``is_plain(checkpoint, *user_types)``: True for ``MISSING`` or plain serializable data."""

    def check(value: Any, *user_types: type) -> bool:
        return value is MISSING or _is_plain(value, user_types)

    return check
