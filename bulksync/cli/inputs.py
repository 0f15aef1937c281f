"""The values the run commands take as JSON: inline, from a file (``@path``) or stdin (``-``).

A command line holds some 128 KiB at most (Linux's limit on one argument), so large inputs
come from a file or a pipe: ``--input @big.json``, ``produce | bulksync submit G --input -``.
No JSON text starts with ``@`` or is a lone ``-``, so the forms cannot be mistaken for JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bulksync.errors import UsageError

STDIN = "-"


def json_option(option: str, text: str) -> Any:
    """The JSON value an option gives: ``text`` itself, ``@path``'s content, or stdin's.

    Raises:
        UsageError: a file that cannot be read, or text that is not JSON (option named).
    """
    if text == STDIN:
        source, raw = "stdin", sys.stdin.read()
    elif text.startswith("@"):
        source, raw = f"file {text[1:]}", _read_file(option, text[1:])
    else:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{option} is not valid JSON ({exc}); e.g. {option} '{{\"n\": 1}}', or "
                f"{option} @file.json"
            ) from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} {text}: {source} is not valid JSON ({exc})") from None


def _read_file(option: str, name: str) -> str:
    path = Path(name).expanduser()
    hint = f"pass {option} @PATH of a JSON file, {option} - to read stdin, or the JSON itself"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{option} @{name}: no such file ({path.absolute()}); {hint}") from None
    except IsADirectoryError:
        raise UsageError(f"{option} @{name}: {path} is a directory; {hint}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option} @{name}: {path} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise UsageError(f"{option} @{name}: cannot read {path} ({exc.strerror})") from None


def one_stdin(**options: str | None) -> None:
    """Refuse two options that both read stdin (``-``); ``options`` maps name to text.

    Raises:
        UsageError: naming the options.
    """
    readers = [name for name, text in options.items() if text == STDIN]
    if len(readers) > 1:
        raise UsageError(
            f"{' and '.join(readers)} both read stdin ('-'); pass all but one as @file or JSON"
        )


def run_config(text: str | None, recursion_limit: int | None) -> dict[str, Any] | None:
    """The run's config from ``--config`` (JSON, ``@path`` or ``-``) and ``--recursion-limit``.

    Raises:
        UsageError: not a JSON object, or a key that does not travel with a run (named).
    """
    from bulksync.workers.wire import CONFIG_KEYS

    config = {} if text is None else json_option("--config", text)
    if not isinstance(config, dict):
        raise UsageError(
            f"--config must be a JSON object, got {type(config).__name__}; e.g. --config "
            '\'{"recursion_limit": 50, "tags": ["nightly"]}\''
        )
    allowed = [k for k in CONFIG_KEYS if k != "run_id"]
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise UsageError(
            f"--config key {unknown[0]!r} does not travel with a run; use {', '.join(allowed)}"
        )
    if recursion_limit is not None:
        config["recursion_limit"] = recursion_limit
    return config or None


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--recursion-limit``, shared by ``submit`` and ``resume``."""
    from bulksync.cli import positive_int

    parser.add_argument(
        "--config",
        metavar="JSON",
        help="the run's config as JSON, @FILE or - (stdin): configurable, metadata, tags, "
        "run_name, recursion_limit",
    )
    parser.add_argument(
        "--recursion-limit",
        type=positive_int,
        metavar="N",
        help="most supersteps the run may take (default: the graph's own)",
    )
