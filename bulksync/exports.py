"""Lazy re-exports for a package's ``__init__`` (PEP 562).

A package lists each re-exported name with the module it lives in; a name is imported from
there on first use, so importing one part of bulksync loads only what that part needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names live in ``homes``.

    ``namespace`` is the package's ``globals()``: a name once loaded is stored there, so
    later lookups never reach ``__getattr__`` again.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
