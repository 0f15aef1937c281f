"""Settings: defaults, ``BULKSYNC_*`` overrides, and the errors for unusable URLs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bulksync import settings as settings_module
from bulksync.settings import Settings, redact

URL_VARIABLES = {
    "BULKSYNC_BROKER_URL": "broker_url",
    "BULKSYNC_REDIS_URL": "redis_url",
    "BULKSYNC_DATABASE_URL": "database_url",
}


def test_defaults_without_any_variable() -> None:
    got = Settings.from_env({})
    assert got.home == Path("~/.bulksync").expanduser()
    assert got.home.is_absolute()
    assert got.broker_url == "redis://127.0.0.1:6379/0"
    assert got.redis_url == "redis://127.0.0.1:6379/0"
    assert got.database_url == "postgresql://127.0.0.1:5432/postgres"
    assert got.demo_db == got.home / "demo.sqlite"


def test_from_env_equals_default_construction() -> None:
    assert Settings.from_env({}) == Settings()


def test_overrides(tmp_path: Path) -> None:
    env = {
        "BULKSYNC_HOME": str(tmp_path / "home"),
        "BULKSYNC_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
        "BULKSYNC_REDIS_URL": "rediss://cache.internal:6380/3",
        "BULKSYNC_DATABASE_URL": "postgres://app@db.internal/bulk",
    }
    got = Settings.from_env(env)
    assert got.home == tmp_path / "home"
    assert got.broker_url == env["BULKSYNC_BROKER_URL"]
    assert got.redis_url == env["BULKSYNC_REDIS_URL"]
    assert got.database_url == env["BULKSYNC_DATABASE_URL"]
    assert got.demo_db == tmp_path / "home" / "demo.sqlite"


def test_home_expands_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    got = Settings.from_env({"BULKSYNC_HOME": "~/elsewhere"})
    assert got.home == tmp_path / "elsewhere"


def test_empty_variable_means_default() -> None:
    env = {"BULKSYNC_HOME": "", **dict.fromkeys(URL_VARIABLES, "")}
    assert Settings.from_env(env) == Settings.from_env({})


def test_reads_os_environ_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULKSYNC_REDIS_URL", "redis://10.1.2.3:6379/1")
    assert Settings.from_env().redis_url == "redis://10.1.2.3:6379/1"
    monkeypatch.setenv("BULKSYNC_REDIS_URL", "unix:///run/redis.sock")
    assert Settings.from_env().redis_url == "unix:///run/redis.sock"


def test_ignores_unrelated_variables() -> None:
    assert Settings.from_env({"REDIS_URL": "http://nope", "HOME": "/x"}) == Settings.from_env({})


def test_is_frozen() -> None:
    got = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.redis_url = "redis://other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variable", "schemes"),
    [
        ("BULKSYNC_BROKER_URL", settings_module.BROKER_SCHEMES),
        ("BULKSYNC_REDIS_URL", settings_module.REDIS_SCHEMES),
        ("BULKSYNC_DATABASE_URL", settings_module.DATABASE_SCHEMES),
    ],
)
@pytest.mark.parametrize("bad", ["http://127.0.0.1:1234/", "mysql://db/x", "localhost:6379"])
def test_invalid_scheme_names_variable_and_accepted_schemes(
    variable: str, schemes: tuple[str, ...], bad: str
) -> None:
    with pytest.raises(ValueError, match=variable) as info:
        Settings.from_env({variable: bad})
    message = str(info.value)
    assert bad in message
    for scheme in schemes:
        assert f"{scheme}://" in message


@pytest.mark.parametrize("variable", list(URL_VARIABLES))
def test_each_accepted_scheme_passes(variable: str) -> None:
    schemes = {
        "BULKSYNC_BROKER_URL": settings_module.BROKER_SCHEMES,
        "BULKSYNC_REDIS_URL": settings_module.REDIS_SCHEMES,
        "BULKSYNC_DATABASE_URL": settings_module.DATABASE_SCHEMES,
    }[variable]
    for scheme in schemes:
        url = f"{scheme.upper()}://host/0"  # schemes are case-insensitive
        assert getattr(Settings.from_env({variable: url}), URL_VARIABLES[variable]) == url


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(ValueError, match="BULKSYNC_DATABASE_URL"):
        Settings(database_url="sqlite:///x.db")


def test_error_hides_password() -> None:
    with pytest.raises(ValueError, match="BULKSYNC_BROKER_URL") as info:
        Settings.from_env({"BULKSYNC_BROKER_URL": "http://admin:s3cret@broker:80/"})
    assert "s3cret" not in str(info.value)
    assert "admin:***@broker" in str(info.value)


def test_repr_hides_passwords() -> None:
    got = Settings.from_env(
        {
            "BULKSYNC_BROKER_URL": "amqp://guest:pw-one@mq//",
            "BULKSYNC_REDIS_URL": "redis://:pw-two@cache:6379/0",
            "BULKSYNC_DATABASE_URL": "postgresql://app:pw-three@db/bulk",
        }
    )
    text = repr(got)
    for secret in ("pw-one", "pw-two", "pw-three"):
        assert secret not in text
    assert "cache:6379" in text


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
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected
