"""The services' addresses: checking a URL's scheme, and hiding a password before it is shown.

Every message, log line and ``repr`` that names Redis, the broker or Postgres shows its URL
through :func:`redact`, so a password never reaches them.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from bulksync.errors import ConfigError

_KEYWORD_PASSWORD: Final = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)")
"""A libpq connection string's ``password=`` keyword (quoted or not), or a URL's query one."""


def check_url(variable: str, url: str, schemes: tuple[str, ...], example: str) -> None:
    """Check that ``url`` starts with ``<scheme>://`` for one of ``schemes``.

    Raises:
        ConfigError: naming ``variable``, the value (password hidden) and the accepted schemes.
    """
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in schemes:
        return
    found = f"scheme '{scheme}'" if scheme else "no '<scheme>://' prefix"
    accepted = ", ".join(f"{s}://" for s in schemes)
    raise ConfigError(
        f"{variable}={redact(url)!r} has {found}; set it to a URL starting with one of "
        f"{accepted} (for example {example})"
    )


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, safe to put in a message or a log.

    Both spellings are covered: a URL's ``user:password@`` and a libpq connection string's
    (or a URL query's) ``password=`` keyword.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed netloc (bad port, bracket): show no part of it
        return "<unparsable URL>"
    if password:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        url = parts._replace(netloc=f"{user}:***@{hostinfo}").geturl()
    return _KEYWORD_PASSWORD.sub(r"\1***", url)
