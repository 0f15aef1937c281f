"""Settings: defaults, ``BULKSYNC_*`` overrides, the declarations, and the errors for bad values."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from bulksync import settings as settings_module
from bulksync.declaration import GROUPS, Declaration
from bulksync.errors import ConfigError
from bulksync.service import coordinator as coordinator_module
from bulksync.settings import Settings, declarations, env_setting

README = Path(__file__).resolve().parents[2] / "README.md"
NUMBERS = [d for d in declarations() if d.kind in (int, float)]

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


# -- the declarations ---------------------------------------------------------------------


def test_every_field_is_declared_with_group_unit_and_help() -> None:
    declared = declarations()
    assert [d.name for d in declared] == [f.name for f in dataclasses.fields(Settings)]
    for d in declared:
        assert d.group in GROUPS, d.name
        assert d.doc and "\n" not in d.doc, d.name
        assert d.env == "BULKSYNC_" + d.name.upper()
        assert d.kind in (str, int, float, bool, Path), d.name
        if d.kind in (int, float):
            assert d.unit, f"{d.name} needs a unit"
        assert d.default_text, d.name
    assert {d.group for d in declared} == set(GROUPS)


def test_groups_partition_the_declarations() -> None:
    by_group = [d for group in GROUPS for d in declarations(group)]
    assert sorted(d.name for d in by_group) == sorted(d.name for d in declarations())


def test_defaults_match_the_declarations() -> None:
    got = Settings()
    for d in declarations():
        if d.default is not None:
            assert getattr(got, d.name) == d.default, d.name


@pytest.mark.parametrize("declared", NUMBERS, ids=lambda d: d.env)
def test_each_number_is_read_from_its_variable(declared: Declaration) -> None:
    value = 3 if declared.name != "stale_after" else 60
    got = Settings.from_env({declared.env: str(value)})
    assert getattr(got, declared.name) == value
    assert type(getattr(got, declared.name)) is declared.kind


@pytest.mark.parametrize("declared", NUMBERS, ids=lambda d: d.env)
@pytest.mark.parametrize("bad", ["abc", "0", "-1", "inf", "nan", "1e"])
def test_a_bad_number_names_its_variable_and_what_to_set(declared: Declaration, bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({declared.env: bad})
    message = str(info.value)
    assert message.startswith(f"{declared.env}={bad!r}: set it to a positive ")
    assert declared.unit in message and f"default: {declared.default_text}" in message


@pytest.mark.parametrize("declared", [d for d in NUMBERS if d.kind is int], ids=lambda d: d.env)
def test_a_whole_number_setting_refuses_a_fraction(declared: Declaration) -> None:
    with pytest.raises(ConfigError, match=f"{declared.env}='2.5': set it to a positive whole"):
        Settings.from_env({declared.env: "2.5"})


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_runs", 0), ("heartbeat", -1.0), ("max_batch", 2.5), ("step_ttl", True)],
)
def test_direct_construction_checks_numbers(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"BULKSYNC_{field.upper()}="):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_an_empty_queue_is_refused() -> None:
    with pytest.raises(ConfigError, match="BULKSYNC_QUEUE='': set it to a queue name"):
        Settings(queue="")


def test_a_non_string_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="BULKSYNC_REDIS_URL=6379"):
        Settings(redis_url=6379)  # type: ignore[arg-type]


def test_a_bad_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="BULKSYNC_REDIS_URL"):
        Settings.from_env({"BULKSYNC_REDIS_URL": "http://cache"})


def test_stale_after_must_exceed_the_heartbeat() -> None:
    with pytest.raises(ConfigError, match=r"BULKSYNC_STALE_AFTER .* not more than the heartbeat"):
        Settings.from_env({"BULKSYNC_HEARTBEAT": "5", "BULKSYNC_STALE_AFTER": "5"})


def test_derived_defaults() -> None:
    got = Settings(heartbeat=2.0, max_runs=8)
    assert (got.lease_ttl, got.db_connections) == (6.0, 12)
    assert Settings(max_runs=500).db_connections == 36  # capped: runs share connections
    set_ = Settings(heartbeat=2.0, stale_after=7.0, db_pool_size=3)
    assert (set_.lease_ttl, set_.db_connections) == (7.0, 3)


def test_repr_shows_every_setting() -> None:
    text = repr(Settings())
    for d in declarations():
        assert f"{d.name}=" in text


def test_repr_of_a_copy_with_new_tunables_still_hides_passwords() -> None:
    got = dataclasses.replace(
        Settings(redis_url="redis://:pw-two@cache:6379/0"), max_runs=3, heartbeat=1.0
    )
    assert "pw-two" not in repr(got) and "max_runs=3" in repr(got)


def test_the_readme_lists_every_setting_with_its_default() -> None:
    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(BULKSYNC_[A-Z0-9_]+)` \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    listed = {env: default.strip() for env, default, _ in rows}
    assert sorted(listed) == sorted(d.env for d in declarations())
    for d in declarations():
        assert d.default_text in listed[d.env], f"README: {d.env} defaults to {d.default_text}"


def test_no_component_takes_loose_options() -> None:
    for function in (coordinator_module.Coordinator.__init__, coordinator_module.open_coordinator):
        kinds = {p.kind for p in inspect.signature(function).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, function


@pytest.mark.parametrize(
    ("text", "expected"), [("1", True), ("true", True), ("On", True), ("0", False), ("no", False)]
)
def test_a_flag_setting_reads_the_usual_words(text: str, expected: bool) -> None:
    assert Settings.from_env({"BULKSYNC_STRICT": text}).strict is expected
    assert env_setting("strict", {"BULKSYNC_STRICT": text}) is expected


def test_a_flag_setting_refuses_other_words_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=re.escape("BULKSYNC_STRICT='maybe': set it to 1 (on)")):
        Settings.from_env({"BULKSYNC_STRICT": "maybe"})


def test_one_setting_is_read_without_the_others() -> None:
    broken = {"BULKSYNC_STRICT": "1", "BULKSYNC_REDIS_URL": "nope"}
    assert env_setting("strict", broken) is True
    assert env_setting("strict", {}) is False
