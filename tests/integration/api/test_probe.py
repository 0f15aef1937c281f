"""``bulksync probe`` against the real processes of the module's cluster (this host's)."""

from __future__ import annotations

import dataclasses
import io
from urllib.parse import urlparse

import pytest

from bulksync.cli.probe import run_probe
from bulksync.settings import Settings
from tests.integration.api.conftest import ApiServer
from tests.integration.private_services import free_port

pytestmark = pytest.mark.integration


def probe(settings: Settings, role: str, port: int | None = None) -> tuple[int, str]:
    import argparse

    out = io.StringIO()
    code = run_probe(argparse.Namespace(role=role, port=port), settings, out)
    return code, out.getvalue().strip()


def test_each_live_process_passes(api_server: ApiServer) -> None:
    port = urlparse(api_server.url).port
    for role, at in (("coordinator", None), ("worker", None), ("api", port)):
        code, said = probe(api_server.settings, role, at)
        assert (code, said) == (0, f"bulksync probe: {role} alive")


def test_what_is_not_there_fails_saying_why(api_server: ApiServer) -> None:
    code, said = probe(api_server.settings, "api", free_port())
    assert code == 1 and "api not alive" in said and "/ok" in said
    # A Redis database no coordinator announces in.
    elsewhere = dataclasses.replace(
        api_server.settings, redis_url=api_server.settings.redis_url.rsplit("/", 1)[0] + "/13"
    )
    code, said = probe(elsewhere, "coordinator")
    assert code == 1 and "has announced its graphs" in said
