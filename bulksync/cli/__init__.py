"""The ``bulksync`` command.

Exit codes:

- 0: success (a run that paused on an interrupt included);
- 1: the run a command waited for failed (``submit --wait``, ``resume --wait``, ``follow``);
- 2: a problem with the command line or its environment (bad flag, bad ``BULKSYNC_*``
  variable, unusable database path, a service that cannot be reached, an unknown run or
  thread), reported as one line on stderr;
- 130: interrupted by Ctrl-C (a run being watched goes on; the command says how to
  follow or cancel it);
- 141: stdout was closed early (``bulksync runs | head -1``): the command stops quietly.

Settings come from ``BULKSYNC_*`` variables; the flags of a setting (``--max-runs``, …)
override them. Anything else is a bug in bulksync and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Final

from bulksync.cli.setting_flags import apply_setting_flags
from bulksync.errors import ConfigError, ServiceError
from bulksync.settings import Settings

PROG: Final = "bulksync"
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130  # the shell convention for Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE: Final = 141  # the shell convention for a closed pipe (128 + SIGPIPE)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bulksync`` with ``argv`` (default: ``sys.argv[1:]``) and return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and argparse's own usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except ConfigError as exc:  # a setting's flag has a bad value; the message names it
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = apply_setting_flags(Settings.from_env(), args)
    except ConfigError as exc:  # the message names the variable or flag at fault
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.run(args, settings, sys.stdout)
        sys.stdout.flush()  # here, where a closed pipe can still be caught
    except BrokenPipeError:  # the reader is gone (`| head`): nothing more to say
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (ConfigError, ServiceError) as exc:  # bad input or an unreachable service: one line
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``bulksync`` and all its subcommands."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run LangGraph-style graphs on a bulk-synchronous-parallel core.",
        epilog="Settings come from BULKSYNC_* environment variables; see README.md.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from bulksync.cli import api, cluster, demo, flower, probe, worker

    demo.add_parser(commands)
    worker.add_parser(commands)
    cluster.add_parsers(commands)
    flower.add_parser(commands)
    api.add_parser(commands)
    probe.add_parser(commands)
    return parser


def positive_int(text: str) -> int:
    """Parse a command-line integer that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def package_version() -> str:
    """The installed bulksync version, or ``unknown`` when run from an uninstalled tree."""
    try:
        return metadata.version("bulksync")
    except metadata.PackageNotFoundError:
        return "unknown"


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not
    report the closed pipe again (Python's documented way, ``signal`` module notes)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass
