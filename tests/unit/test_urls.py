"""The services' URLs: a password never shown, whichever way it is spelled."""

from __future__ import annotations

import pytest

from bulksync.urls import redact


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user@h/0", "redis://user@h/0"),
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("postgresql://u:p@w@h/db", "postgresql://u:***@h/db"),
        ("redis://h:notaport/0", "redis://h:notaport/0"),
        ("redis://u:pw@h:notaport/0", "redis://u:***@h:notaport/0"),
        ("redis://u:pw@[::1/0", "<unparsable URL>"),
        # libpq's keyword spelling, and a password given in a URL's query
        ("host=h password=s3cret dbname=db", "host=h password=*** dbname=db"),
        ("host=h password = 'a \\' b' dbname=db", "host=h password = *** dbname=db"),
        (
            "postgresql://h/db?sslmode=require&password=s3cret",
            "postgresql://h/db?sslmode=require&password=***",
        ),
        ("postgresql://u:pw@h/db?password=s3cret", "postgresql://u:***@h/db?password=***"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected
