"""Channels: the slots of graph state and the rules that combine a step's writes into them."""

from bulksync.channels.any_value import AnyValue
from bulksync.channels.base import BaseChannel
from bulksync.channels.binop import BinaryOperatorAggregate
from bulksync.channels.ephemeral_value import EphemeralValue
from bulksync.channels.last_value import LastValue, LastValueAfterFinish
from bulksync.channels.named_barrier_value import (
    NamedBarrierValue,
    NamedBarrierValueAfterFinish,
)
from bulksync.channels.topic import Topic
from bulksync.channels.untracked_value import UntrackedValue

__all__ = [
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
