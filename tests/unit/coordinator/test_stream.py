"""Stream modes: one list, declared as ``types.StreamMode``, accepted exactly by the parsers."""

from __future__ import annotations

from typing import get_args

import pytest

from bulksync.cli import build_parser
from bulksync.coordinator.stream import ALL_MODES, check_modes, stream_modes
from bulksync.errors import ConfigError
from bulksync.types import StreamMode

NOT_MODES = ("events", "Values", "value", "values ", "tool")
"""Names near the real ones (and one DESIGN.md plans) that no parser may accept yet."""


def test_the_list_is_the_stream_mode_literal() -> None:
    assert get_args(StreamMode) == ALL_MODES
    assert len(set(ALL_MODES)) == len(ALL_MODES)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_mode_is_accepted(mode: str) -> None:
    assert stream_modes(mode, False) == ([mode], True)
    check_modes([mode])
    args = build_parser().parse_args(["submit", "g:graph", "--input", "{}", "--stream-mode", mode])
    assert args.stream_mode == mode


def test_all_modes_together_are_accepted() -> None:
    assert stream_modes(list(ALL_MODES), False) == (list(ALL_MODES), False)


@pytest.mark.parametrize("mode", NOT_MODES)
def test_nothing_else_is_accepted(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="Unknown stream_mode"):
        stream_modes(mode, False)
    with pytest.raises(ConfigError, match="Unknown stream_mode"):
        stream_modes(["values", mode], False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "g:graph", "--input", "{}", "--stream-mode", mode])
    assert "invalid choice" in capsys.readouterr().err
