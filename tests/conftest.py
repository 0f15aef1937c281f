"""Fixtures shared by every test suite; suite-specific ones live next to their tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty ``BULKSYNC_HOME`` for this test, so no test touches ``~/.bulksync``."""
    home = tmp_path / "bulksync-home"
    monkeypatch.setenv("BULKSYNC_HOME", str(home))
    return home
