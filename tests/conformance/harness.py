"""Run one scenario on the reference and on a flavour, and compare what they observed."""

from __future__ import annotations

import pprint
import traceback
from collections.abc import Callable
from typing import Any

from .impls import REFERENCE, Impl, load_impl
from .normalize import Normalized, normalize

Scenario = Callable[[Impl], Any]
"""A scenario builds and runs graphs on the given implementation and returns an observation."""

Conform = Callable[[Scenario], None]
"""The `conform` fixture: check one scenario against the reference."""

_EXPECTED: dict[Scenario, Normalized] = {}


def expected(scenario: Scenario) -> Normalized:
    """The reference's normalised observation of `scenario`, computed once per session."""
    if scenario not in _EXPECTED:
        _EXPECTED[scenario] = normalize(scenario(load_impl(REFERENCE)))
    return _EXPECTED[scenario]


def conform(scenario: Scenario, flavour: str) -> None:
    """Assert that `flavour` observes exactly what the reference observes in `scenario`."""
    want = expected(scenario)
    raw = scenario(load_impl(flavour))
    got = normalize(raw)
    if got.data != want.data:
        raise AssertionError(_mismatch(scenario, flavour, want, got, raw))
    for ref_err, err in zip(want.errors, got.errors, strict=True):
        missing = ref_err.stdlib_bases - err.stdlib_bases
        assert not missing, (
            f"{scenario.__name__}: {flavour}'s {err.name} does not derive from {sorted(missing)} "
            f"as {REFERENCE}'s does, so `except` clauses written for {REFERENCE} would miss it"
        )


def _mismatch(scenario: Scenario, flavour: str, want: Normalized, got: Normalized, raw: Any) -> str:
    """A readable report: both observations, and the tracebacks of errors the flavour raised."""
    lines = [
        f"{scenario.__name__}: {flavour} differs from {REFERENCE}",
        f"--- {REFERENCE} (expected)",
        pprint.pformat(want.data, width=100, sort_dicts=False),
        f"--- {flavour} (observed)",
        pprint.pformat(got.data, width=100, sort_dicts=False),
    ]
    for exc in _exceptions(raw):
        lines.append(f"--- {flavour} raised {type(exc).__name__}:")
        lines.append("".join(traceback.format_exception(exc)).rstrip())
    return "\n".join(lines)


def _exceptions(obj: Any, depth: int = 0) -> list[BaseException]:
    """The exception objects inside an observation (for their tracebacks)."""
    if isinstance(obj, BaseException):
        return [obj]
    if depth > 20:
        return []
    if isinstance(obj, dict):
        items: list[Any] = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    else:
        return []
    return [e for item in items for e in _exceptions(item, depth + 1)]


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or the exception it raised (normalised to its class name)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return exc


def collect(stream: Any) -> list[Any]:
    """Drain a sync stream into a list; an error ends the list as its last element."""
    out: list[Any] = []
    try:
        for chunk in stream:
            out.append(chunk)
    except Exception as exc:
        out.append(exc)
    return out
