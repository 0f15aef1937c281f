"""The normaliser itself: ids become stable placeholders, objects become plain data."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from .normalize import normalize, stdlib_bases

pytestmark = pytest.mark.conformance

U1 = "1f0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"
U2 = "00000000-0000-0000-0000-000000000000"
H1 = "0123456789abcdef0123456789abcdef"


class Interrupt(NamedTuple):
    value: Any
    id: str


class RecursionLike(RecursionError):
    pass


def test_ids_numbered_by_first_appearance_everywhere() -> None:
    obs = {U1: [f"node:{U2}", U1.upper()], "ns": (f"a:{U1}|b:{U2}", H1), H1: {"k": U2}}
    assert normalize(obs).data == {
        "<uuid-1>": ["node:<uuid-2>", "<uuid-1>"],
        "ns": ("a:<uuid-1>|b:<uuid-2>", "<hex-1>"),
        "<hex-1>": {"k": "<uuid-2>"},
    }


def test_same_shape_with_other_ids_compares_equal() -> None:
    other_u1, other_u2 = "9" * 8 + U1[8:], "a" * 8 + U2[8:]
    left = normalize([U1, U2, U1])
    right = normalize([other_u1, other_u2, other_u1])
    swapped = normalize([other_u1, other_u1, other_u2])
    assert left.data == right.data
    assert left.data != swapped.data


def test_hex_inside_longer_tokens_is_kept() -> None:
    longer = H1 + "ff"
    assert normalize(longer).data == longer


def test_library_objects_and_errors_become_tagged_data() -> None:
    got = normalize({"i": Interrupt("v", H1), "e": RecursionLike("x"), "ts": "2026-01-01"})
    assert got.data == {
        "i": ("Interrupt", "v", "<hex-1>"),
        "e": ("error", "RecursionLike"),
        "ts": "<volatile>",
    }
    assert got.errors[0].name == "RecursionLike"
    assert {"RecursionError", "RuntimeError", "Exception"} <= got.errors[0].stdlib_bases


def test_stdlib_bases_skip_library_classes() -> None:
    assert "RecursionLike" not in stdlib_bases(RecursionLike)
    assert "ValueError" in stdlib_bases(ValueError)


def test_unknown_objects_are_named_not_compared() -> None:
    assert normalize([object()]).data == [("object", "object")]
