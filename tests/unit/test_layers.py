"""The package's layers (DESIGN.md §3): imports only go down, no package cycles, a pure core.

Read with ``ast`` (nothing is imported to find the edges): every ``import`` inside
``bulksync/`` counts, at module level or inside a function, except those guarded by
``if TYPE_CHECKING:``. Two probes in a fresh interpreter check what importing the client and
the pure core actually loads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import bulksync

PACKAGE = Path(bulksync.__file__).parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("demo",),
    ("client",),
    ("service",),
    ("prebuilt", "func"),
    ("graph",),
    ("stream",),
    ("workers",),
    ("coordinator",),
    ("channels", "checkpoint", "store", "cache"),
    # settings raises errors.ConfigError, so it sits above errors (which imports nothing), as
    # do the declarations of its fields and the URL checks both use.
    ("settings",),
    ("declaration",),
    ("urls",),
    ("runtime",),
    ("errors", "types", "config", "context", "constants", "callbacks"),
    ("keys", "ids", "exports", "logs", "retry", "rounds", "warnings", "managed", "collector"),
    ("redis_lean",),
)
"""Top to bottom: a unit imports its own layer's units or lower ones, never higher."""

RANK = {unit: len(LAYERS) - i for i, layer in enumerate(LAYERS) for unit in layer}

PURE_CORE = ("plan", "apply", "status", "commands")
IO_MODULES = frozenset(
    {"redis", "celery", "kombu", "psycopg", "psycopg_pool", "sqlite3", "threading", "socket"}
)
CLUSTER_MODULES = frozenset({"redis", "celery", "kombu", "psycopg", "psycopg_pool"})


def unit_of(module: str) -> str:
    """``bulksync.workers.celery.app`` → ``workers``; ``bulksync`` itself → ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of each runtime import in ``path`` (TYPE_CHECKING blocks skipped)."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            if node.module == "bulksync":  # ``from bulksync import keys`` names a module
                for alias in node.names:
                    yield node.lineno, f"bulksync.{alias.name}"


def package_edges() -> Iterator[tuple[str, int, str, str]]:
    """``(file, line, from unit, to unit)`` for every import between two bulksync units."""
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        for line, target in imports(path):
            if not target.startswith("bulksync."):
                continue
            dest = unit_of(target)
            if source and dest and dest != source:
                yield str(path.relative_to(PACKAGE.parent)), line, source, dest


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")} - {""}
    units.discard("__main__")
    assert units - set(RANK) == set(), "add new top-level modules or folders to LAYERS"


def test_imports_only_go_down() -> None:
    upward = [
        f"{file}:{line}: {src} imports {dest} (a higher layer)"
        for file, line, src, dest in package_edges()
        if RANK[dest] > RANK[src]
    ]
    assert upward == []


def test_no_package_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for _, _, src, dest in package_edges():
        graph.setdefault(src, set()).add(dest)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            unit = todo.pop()
            for nxt in graph.get(unit, ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if reaches(b, a))
    assert cycles == []


def test_the_pure_core_imports_no_io_or_concurrency() -> None:
    found = [
        f"{path.name}:{line}: {target}"
        for name in PURE_CORE
        for path in [PACKAGE / "coordinator" / f"{name}.py"]
        for line, target in imports(path)
        if target.split(".")[0] in IO_MODULES | {"asyncio", "secrets", "random", "datetime"}
    ]
    assert found == []


def test_the_coordinator_imports_no_cluster_client() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {target}"
        for path in sorted((PACKAGE / "coordinator").rglob("*.py"))
        for line, target in imports(path)
        if target.split(".")[0] in CLUSTER_MODULES
    ]
    assert found == []


def _loaded_after(statement: str, watch: tuple[str, ...]) -> list[str]:
    """Which of ``watch`` a fresh interpreter has loaded after ``statement``."""
    probe = f"import sys; {statement}; print(','.join(m for m in {watch!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.parametrize(
    ("statement", "forbidden"),
    [
        ("import bulksync.client", ("celery", "kombu")),
        (
            "import bulksync.coordinator.plan",
            ("sqlite3", "threading", "asyncio", "redis", "celery", "psycopg"),
        ),
    ],
)
def test_importing_loads_only_what_is_used(statement: str, forbidden: tuple[str, ...]) -> None:
    assert _loaded_after(statement, forbidden) == []
