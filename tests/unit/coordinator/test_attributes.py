"""Every class of the coordinator declares its state in ``__init__``.

A method may reassign an attribute, never create one: read with ``ast``, each ``self.x = …``
outside ``__init__`` must name an attribute that ``__init__`` (or a property) already sets.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bulksync.coordinator

FOLDER = Path(bulksync.coordinator.__file__).parent


def _assigned(func: ast.FunctionDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(func):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if (
                    isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id == "self"
                ):
                    names.add(leaf.attr)
    return names


def test_no_attribute_is_created_outside_init() -> None:
    late = []
    for path in sorted(FOLDER.glob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            methods = [f for f in cls.body if isinstance(f, ast.FunctionDef)]
            declared = {name for f in methods if f.name == "__init__" for name in _assigned(f)}
            declared |= {f.name for f in methods}  # properties and their setters
            for func in methods:
                if func.name == "__init__":
                    continue
                late += [
                    f"{path.name}:{cls.name}.{func.name} sets self.{name}"
                    for name in sorted(_assigned(func) - declared)
                ]
    assert late == []
