"""Command-line flags derived from the declarations of ``Settings`` (``bulksync.settings``).

``bulksync coordinator`` gets a flag for each setting of the ``coordinator`` group,
``bulksync worker`` for each of the ``worker`` group: name, type, default and help come from
the field, so a new setting shows up in ``--help`` without a second declaration. A flag's
value is parsed and checked as the variable's would be (a bad one raises ``ConfigError``
naming the flag), and a flag given on the command line overrides the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any, Final

from bulksync.declaration import Declaration, Group
from bulksync.settings import Settings, declarations

GIVEN: Final = "settings_given"
"""The attribute of parsed arguments listing the settings given as flags."""


class _SettingAction(argparse.Action):
    """Stores a setting's parsed value and remembers that the command line gave it."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.declaration: Declaration = kwargs.pop("declaration")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        # ConfigError (not argparse's usage error) so that the message says what to set,
        # the same words as for the variable.
        setattr(namespace, self.dest, self.declaration.parse(str(values), self.declaration.flag))
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.dest})


def add_setting_flags(parser: argparse.ArgumentParser, group: Group) -> None:
    """Add a flag for each setting of ``group`` to ``parser`` (dest: the field's name)."""
    for declared in declarations(group):
        text = f"{declared.help} (default: {declared.default_text}; env {declared.env})"
        parser.add_argument(
            declared.flag,
            dest=declared.name,
            action=_SettingAction,
            declaration=declared,
            default=declared.default,
            metavar="SECONDS" if declared.unit == "seconds" else "N",
            help=text.replace("%", "%%"),  # argparse formats help with %
        )


def apply_setting_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """``settings`` with the values of the setting flags given on the command line.

    Raises:
        ConfigError: the combination is not one bulksync can use (e.g. ``--stale-after``
            not above the heartbeat).
    """
    given: set[str] = getattr(args, GIVEN, set())
    if not given:
        return settings
    return dataclasses.replace(settings, **{name: getattr(args, name) for name in given})
