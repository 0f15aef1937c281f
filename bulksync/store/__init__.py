"""Long-term memory shared across threads and runs (``langgraph.store``'s API)."""

from bulksync.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from bulksync.store.memory import InMemoryStore

__all__ = [
    "BaseStore",
    "GetOp",
    "InMemoryStore",
    "Item",
    "ListNamespacesOp",
    "MatchCondition",
    "Op",
    "PutOp",
    "Result",
    "SearchItem",
    "SearchOp",
]
