"""When a step's messages may skip ``send_task``: only where the bytes cannot differ."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bulksync.settings import Settings
from bulksync.workers.celery.app import make_app
from bulksync.workers.celery.publish import DirectPublisher

BASE = Settings(broker_url="redis://127.0.0.1:6379/0", redis_url="redis://127.0.0.1:6379/0")


def publisher(settings: Settings = BASE, **conf: Any) -> DirectPublisher | None:
    app = make_app(settings)
    app.conf.update(conf)
    return DirectPublisher.for_app(app, settings)


def test_the_redis_database_holding_the_steps_takes_messages_directly() -> None:
    direct = publisher()
    assert direct is not None and direct.events_topic == "/0.celeryev/task.multi"
    other_db = dataclasses.replace(
        BASE, broker_url="redis://localhost:6379/3", redis_url="redis://localhost/3"
    )
    found = publisher(other_db)
    assert found is not None and found.events_topic == "/3.celeryev/task.multi"


@pytest.mark.parametrize(
    ("broker", "steps"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/0"),  # another database
        ("redis://10.0.0.9:6379/0", "redis://127.0.0.1:6379/0"),  # another server
        ("redis://127.0.0.1:6379/0", "unix:///run/redis.sock"),
    ],
)
def test_another_broker_takes_messages_through_send_task(broker: str, steps: str) -> None:
    assert publisher(dataclasses.replace(BASE, broker_url=broker, redis_url=steps)) is None


@pytest.mark.parametrize(
    "conf",
    [
        {"broker_transport_options": {"global_keyprefix": "app1:"}},
        {"broker_transport_options": {"sep": ":"}},
        {"broker_transport_options": {"priority_steps": [1, 5]}},
        {"task_compression": "gzip"},
        {"task_routes": {"bulksync.*": {"queue": "elsewhere"}}},
        {"task_protocol": 1},
    ],
)
def test_options_that_change_the_bytes_keep_send_task(conf: dict[str, Any]) -> None:
    assert publisher(**conf) is None


def test_fanout_options_name_the_events_topic() -> None:
    unprefixed = publisher(broker_transport_options={"fanout_prefix": False})
    assert unprefixed is not None and unprefixed.events_topic == "celeryev/task.multi"
    no_patterns = publisher(broker_transport_options={"fanout_patterns": False})
    assert no_patterns is not None and no_patterns.events_topic == "/0.celeryev"
