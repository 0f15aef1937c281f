"""The public names of ``bulksync.channels``, pinned."""

from __future__ import annotations

import langgraph.channels

import bulksync.channels
from bulksync.channels.base import BaseChannel


def test_public_names_are_pinned() -> None:
    assert sorted(bulksync.channels.__all__) == [
        "AnyValue",
        "BaseChannel",
        "BinaryOperatorAggregate",
        "EphemeralValue",
        "LastValue",
        "LastValueAfterFinish",
        "NamedBarrierValue",
        "NamedBarrierValueAfterFinish",
        "Topic",
        "UntrackedValue",
    ]


def test_every_langgraph_channel_but_delta_has_a_twin() -> None:
    missing = set(langgraph.channels.__all__) - set(bulksync.channels.__all__)
    assert missing == {"DeltaChannel"}


def test_every_exported_channel_implements_the_contract() -> None:
    for name in bulksync.channels.__all__:
        cls = getattr(bulksync.channels, name)
        assert issubclass(cls, BaseChannel)
        assert cls is BaseChannel or not cls.__abstractmethods__
