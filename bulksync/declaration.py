"""How a setting is declared, and what its declaration knows: variable, flag, parsing, checks.

:func:`setting` declares a field of a settings dataclass (``settings.Settings``): its default,
group, unit and one-line help. :func:`read_declarations` reads the fields back as
:class:`Declaration` objects, which parse a variable's text, check a value, and show it safely
for a log.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Final, Literal

from bulksync.errors import ConfigError
from bulksync.urls import check_url, redact

ENV_PREFIX: Final = "BULKSYNC_"

Group = Literal["cluster", "coordinator", "worker", "api"]
GROUPS: Final[tuple[Group, ...]] = ("cluster", "coordinator", "worker", "api")


def setting(
    default: Any = None,
    *,
    group: Group,
    doc: str,
    unit: str = "",
    schemes: tuple[str, ...] = (),
    shown: str | None = None,
    factory: Any = None,
    secret: bool = False,
) -> Any:
    """Declare a field of a settings dataclass (``settings.Settings``): its default, group,
    unit and one-line help.

    ``shown`` is the default as people read it, where the value itself does not say it (a
    ``None`` that means "three heartbeats"); ``factory`` builds a default computed per instance;
    a ``secret`` is never shown (``repr``, logs).
    """
    metadata = {
        "group": group,
        "doc": doc,
        "unit": unit,
        "schemes": schemes,
        "shown": shown,
        "secret": secret,
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, slots=True)
class Declaration:
    """One setting as declared: its field, group, type, default, unit and help."""

    name: str
    group: Group
    kind: type
    optional: bool
    default: Any
    unit: str
    doc: str
    schemes: tuple[str, ...]
    shown: str | None
    secret: bool = False

    @property
    def env(self) -> str:
        """The environment variable that sets it: ``BULKSYNC_<NAME>``."""
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        """The command-line flag that sets it (coordinator and worker groups only)."""
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str:
        """The default as the README and ``--help`` show it."""
        if self.shown is not None:
            return self.shown
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)

    @property
    def help(self) -> str:
        """The one-line help (with the schemes a URL may have), as ``--help`` shows it."""
        accepted = f" ({', '.join(self.schemes)})" if self.schemes else ""
        return f"{self.doc}{accepted}"

    def show(self, value: Any) -> Any:
        """``value`` safe for a log: a URL with its password hidden, a path as text."""
        if self.secret:
            return "***" if value else value
        if self.schemes and isinstance(value, str):
            return redact(value)
        return str(value) if isinstance(value, Path) else value

    def parse(self, text: str, source: str) -> Any:
        """The value ``text`` sets, checked; ``source`` (variable or flag) names it in errors.

        Raises:
            ConfigError: naming ``source``, the text and what to set instead.
        """
        if self.kind is Path:
            return Path(text).expanduser()
        if self.kind is bool:
            flag = text.strip().lower()
            if flag in ("1", "true", "yes", "on"):
                return True
            if flag in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{source}={text!r}: set it to 1 (on) or 0 (off).")
        if self.kind in (int, float):
            try:
                value: Any = self.kind(text)
            except ValueError:
                value = None
            if value is None or not self._fits(value):
                raise ConfigError(f"{source}={text!r}: set it to {self._wanted()}.")
            return value
        self.check(text, source)
        return text

    def check(self, value: Any, source: str) -> None:
        """Raise ``ConfigError`` naming ``source`` unless ``value`` is one this setting takes."""
        if value is None and self.optional:
            return
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{source}={value!r}: set it to True or False.")
        elif self.kind in (int, float):
            if not self._fits(value):
                raise ConfigError(f"{source}={value!r}: set it to {self._wanted()}.")
        elif self.kind is str and not (isinstance(value, str) and value):
            raise ConfigError(f"{source}={value!r}: set it to a {self.unit or 'URL'}.")
        elif self.schemes:
            check_url(source, value, self.schemes, str(self.default))

    def _fits(self, value: Any) -> bool:
        """A number of the declared kind, positive and finite (``True`` is no number)."""
        allowed = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, allowed):
            return False
        return value > 0 and math.isfinite(value)

    def _wanted(self) -> str:
        what = "whole number" if self.kind is int else "number"
        return f"a positive {what} of {self.unit} (default: {self.default_text})"


def read_declarations(settings: type, group: Group | None = None) -> tuple[Declaration, ...]:
    """The fields of the dataclass ``settings`` declared with :func:`setting`, in declaration
    order, or those of one ``group``."""
    hints = typing.get_type_hints(settings)
    found = []
    for field in dataclasses.fields(settings):
        meta = field.metadata
        if group is not None and meta["group"] != group:
            continue
        kind, optional = _kind(hints[field.name])
        default = field.default if field.default_factory is dataclasses.MISSING else None
        found.append(
            Declaration(
                name=field.name,
                group=meta["group"],
                kind=kind,
                optional=optional,
                default=default,
                unit=meta["unit"],
                doc=meta["doc"],
                schemes=meta["schemes"],
                shown=meta["shown"],
                secret=meta["secret"],
            )
        )
    return tuple(found)


def _kind(hint: Any) -> tuple[type, bool]:
    """``float | None`` → ``(float, True)``; ``int`` → ``(int, False)``."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False
