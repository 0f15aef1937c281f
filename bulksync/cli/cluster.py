"""The commands that drive runs on the cluster: coordinator, submit, runs, state, …"""

from __future__ import annotations

from typing import Any


def add_parsers(commands: Any) -> None:
    """Register the run commands."""
