"""The curated public names of ``bulksync`` and ``bulksync.checkpoint``, re-exported lazily.

``__all__`` is pinned here: adding or removing a public name is a deliberate act. Each name
must resolve, through PEP 562 ``__getattr__``, to the very object of its home module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

import bulksync
import bulksync.checkpoint

PUBLIC: dict[str, dict[str, str]] = {
    "bulksync": {
        "END": "bulksync.constants",
        "START": "bulksync.constants",
        "BulkSyncError": "bulksync.errors",
        "Command": "bulksync.types",
        "CompiledStateGraph": "bulksync.graph.compiled",
        "EmptyInputError": "bulksync.errors",
        "GraphInterrupt": "bulksync.errors",
        "GraphRecursionError": "bulksync.errors",
        "Interrupt": "bulksync.types",
        "InvalidGraphError": "bulksync.errors",
        "InvalidUpdateError": "bulksync.errors",
        "MessagesState": "bulksync.graph.message",
        "Overwrite": "bulksync.types",
        "RetryPolicy": "bulksync.types",
        "Send": "bulksync.types",
        "StateGraph": "bulksync.graph.state",
        "add_messages": "bulksync.graph.message",
        "get_config": "bulksync.config",
        "get_stream_writer": "bulksync.config",
        "interrupt": "bulksync.types",
    },
    "bulksync.checkpoint": {
        "Checkpoint": "bulksync.checkpoint.base",
        "CheckpointSaver": "bulksync.checkpoint.base",
        "CheckpointTuple": "bulksync.checkpoint.base",
        "InMemorySaver": "bulksync.checkpoint.memory",
        "MemorySaver": "bulksync.checkpoint.memory",
        "MsgpackSerde": "bulksync.checkpoint.serde",
        "PendingWrite": "bulksync.checkpoint.base",
        "Serde": "bulksync.checkpoint.base",
        "SqliteSaver": "bulksync.checkpoint.sqlite",
        "dumps_for": "bulksync.checkpoint.serde",
        "register_type": "bulksync.checkpoint.serde",
    },
}
"""Package → public name → the module that defines it."""

PACKAGES: dict[str, ModuleType] = {"bulksync": bulksync, "bulksync.checkpoint": bulksync.checkpoint}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_pinned(package: str) -> None:
    assert sorted(PACKAGES[package].__all__) == sorted(PUBLIC[package])


@pytest.mark.parametrize(
    ("package", "name", "home"),
    [(p, n, h) for p, names in sorted(PUBLIC.items()) for n, h in sorted(names.items())],
)
def test_each_name_is_its_home_modules_object(package: str, name: str, home: str) -> None:
    assert getattr(PACKAGES[package], name) is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_dir_lists_the_lazy_names(package: str) -> None:
    assert set(PUBLIC[package]) <= set(dir(PACKAGES[package]))


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_an_unknown_name_raises_attribute_error(package: str) -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = PACKAGES[package].no_such_name
    assert not hasattr(PACKAGES[package], "no_such_name")


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from bulksync import *", namespace)
    assert set(PUBLIC["bulksync"]) <= set(namespace)
