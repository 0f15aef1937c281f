"""``bulksync probe`` reads the role and port of the container's own command."""

from __future__ import annotations

import pytest

from bulksync.cli.probe import role_of


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["/usr/local/bin/bulksync", "coordinator", "--graph", "bulksync.demo"],
            ("coordinator", None),
        ),
        (["bulksync", "worker", "--graph", "x", "--concurrency", "2"], ("worker", None)),
        (["bulksync", "api", "--graph", "x", "--port", "8124"], ("api", 8124)),
        (["python", "-m", "bulksync", "flower", "--port=5556"], ("flower", 5556)),
        (["bulksync", "--help"], (None, None)),
        (["redis-server", "--port", "6379"], (None, None)),
        ([], (None, None)),
    ],
)
def test_the_role_comes_from_the_command_line(
    argv: list[str], expected: tuple[str | None, int | None]
) -> None:
    assert role_of(argv) == expected
