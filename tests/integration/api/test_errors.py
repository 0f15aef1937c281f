"""``bulksync api``'s answers to bad requests and lost services, over plain HTTP.

Each error is JSON ``{"detail": ...}`` with the status that says what is wrong, names what
is at fault, and changes nothing: the thread's runs and state are checked after it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import (
    APPROVAL,
    FANOUT,
    GRAPHS,
    ApiServer,
    Process,
    wait_for_http,
)
from tests.integration.private_services import PrivatePostgres, PrivateRedis, free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def http(api_server: ApiServer) -> Iterator[httpx.Client]:
    with api_server.http() as client:
        yield client


def detail(response: httpx.Response) -> str:
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"], body
    return str(body["detail"])


def thread_with_a_run(http: httpx.Client) -> str:
    thread_id = http.post("/threads", json={}).json()["thread_id"]
    done = http.post(f"/threads/{thread_id}/runs/wait", json=run(items=[3]))
    assert done.json()["total"] == 9
    return thread_id


def run(**values: Any) -> dict[str, Any]:
    return {"assistant_id": FANOUT, "input": values}


def unchanged(http: httpx.Client, thread_id: str) -> None:
    """The thread still has its one run and the state it left."""
    assert len(http.get(f"/threads/{thread_id}/runs").json()) == 1
    assert http.get(f"/threads/{thread_id}/state").json()["values"]["total"] == 9


def test_unknown_assistant_thread_and_run_are_404(http: httpx.Client) -> None:
    thread_id = thread_with_a_run(http)
    answer = http.post(f"/threads/{thread_id}/runs", json={"assistant_id": "pkg.nope:graph"})
    assert answer.status_code == 404 and "no assistant 'pkg.nope:graph'" in detail(answer)
    assert FANOUT in detail(answer)  # the graphs it does serve are named
    for path in ("/threads/nope", "/threads/nope/state", f"/threads/{thread_id}/runs/nope"):
        answer = http.get(path)
        assert answer.status_code == 404, path
        assert "nope" in detail(answer)
    answer = http.post("/threads/nope/runs", json=run(items=[1]))
    assert answer.status_code == 404 and "if_not_exists" in detail(answer)
    assert http.get("/threads/nope").status_code == 404  # the run did not create it
    unchanged(http, thread_id)


def test_a_stream_of_a_run_that_does_not_exist_is_404(http: httpx.Client) -> None:
    thread_id = thread_with_a_run(http)
    answer = http.get(f"/threads/{thread_id}/runs/{uuid.uuid4()}/stream")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"


def test_a_busy_thread_refuses_a_run_with_reject(http: httpx.Client) -> None:
    thread_id = http.post("/threads", json={}).json()["thread_id"]
    slow = http.post(f"/threads/{thread_id}/runs", json=run(items=[1], seconds=1.5)).json()
    answer = http.post(
        f"/threads/{thread_id}/runs", json={**run(items=[2]), "multitask_strategy": "reject"}
    )
    assert answer.status_code == 409 and "is busy" in detail(answer)
    assert http.get(f"/threads/{thread_id}").json()["status"] == "busy"
    http.get(f"/threads/{thread_id}/runs/{slow['run_id']}/join")
    assert [r["run_id"] for r in http.get(f"/threads/{thread_id}/runs").json()] == [slow["run_id"]]


def test_a_taken_thread_id_is_409_unless_asked_to_do_nothing(http: httpx.Client) -> None:
    thread_id = thread_with_a_run(http)
    answer = http.post("/threads", json={"thread_id": thread_id, "metadata": {"x": 1}})
    assert answer.status_code == 409 and thread_id in detail(answer)
    same = http.post("/threads", json={"thread_id": thread_id, "if_exists": "do_nothing"})
    assert same.status_code == 200 and same.json()["metadata"] == {}
    unchanged(http, thread_id)


def test_a_thread_runs_only_its_own_graph(http: httpx.Client) -> None:
    thread_id = thread_with_a_run(http)
    answer = http.post(
        f"/threads/{thread_id}/runs", json={"assistant_id": APPROVAL, "input": {"text": "x"}}
    )
    assert answer.status_code == 409 and f"belongs to graph '{FANOUT}'" in detail(answer)
    unchanged(http, thread_id)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"assistant_id": FANOUT, "stream_mode": 5}, "stream_mode"),
        ({"assistant_id": FANOUT, "stream_mode": ["events"]}, "'events'"),
        ({"assistant_id": FANOUT, "multitask_strategy": "rollback"}, "multitask_strategy"),
        ({"assistant_id": FANOUT, "webhook": "http://example.com/hook"}, "webhook"),
        ({"assistant_id": FANOUT, "interrupt_before": 3}, "interrupt_before"),
        ({"input": {"items": [1]}}, "assistant_id"),
    ],
)
def test_bad_input_is_422_naming_the_field(
    http: httpx.Client, body: dict[str, Any], named: str
) -> None:
    thread_id = thread_with_a_run(http)
    answer = http.post(f"/threads/{thread_id}/runs", json=body)
    assert answer.status_code == 422 and named in detail(answer)
    unchanged(http, thread_id)


def test_a_malformed_body_is_422(http: httpx.Client) -> None:
    thread_id = thread_with_a_run(http)
    answer = http.post(
        f"/threads/{thread_id}/runs",
        content=b'{"assistant_id": ',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 422 and "JSON" in detail(answer)
    unchanged(http, thread_id)


def test_a_failed_run_reports_its_error(http: httpx.Client) -> None:
    thread_id = http.post("/threads", json={}).json()["thread_id"]
    answer = http.post(f"/threads/{thread_id}/runs/wait", json=run(items=[2, -1]))
    error = answer.json()["__error__"]
    assert error["error"] == "ValueError" and "negative number here: -1" in error["message"]
    with http.stream(
        "POST", f"/threads/{thread_id}/runs/stream", json={**run(items=[-2]), "stream_mode": []}
    ) as events:
        text = "".join(events.iter_text())
    assert "event: error" in text and "negative number here: -2" in text
    statuses = [r["status"] for r in http.get(f"/threads/{thread_id}/runs").json()]
    assert statuses == ["error", "error"]
    assert http.get(f"/threads/{thread_id}").json()["status"] == "error"


# -- a server of its own: keys, body limit, lost services -------------------------------------


def own_api(server: ApiServer, **env: str) -> tuple[str, Process]:
    port = free_port()
    api = server.start("api", "--graph", GRAPHS, "--port", str(port), "--loglevel", "INFO", env=env)
    url = f"http://127.0.0.1:{port}"
    wait_for_http(api, url, "/ok")
    return url, api


def test_keys_are_required_when_set_and_never_logged(api_server: ApiServer) -> None:
    url, api = own_api(
        api_server, BULKSYNC_API_KEYS="k-first, k-second", BULKSYNC_API_MAX_BODY="2048"
    )
    try:
        with httpx.Client(base_url=url) as http:
            missing = http.post("/assistants/search", json={})
            assert missing.status_code == 401 and "x-api-key" in detail(missing)
            wrong = http.post("/assistants/search", json={}, headers={"x-api-key": "k-third"})
            assert wrong.status_code == 401
            right = http.post("/assistants/search", json={}, headers={"x-api-key": "k-second"})
            assert right.status_code == 200 and len(right.json()) == 3
            assert http.get("/ok").status_code == 200  # probes need no key
            big = {"assistant_id": FANOUT, "input": {"items": list(range(2000))}}
            answer = http.post("/runs", content=json.dumps(big), headers={"x-api-key": "k-first"})
            assert answer.status_code == 413 and "BULKSYNC_API_MAX_BODY" in detail(answer)
        with api_server.sdk(api_key="k-first") as sdk:  # what the SDK sends
            assert sdk.assistants.get(FANOUT)["graph_id"] == FANOUT
    finally:
        api.stop()
    log = api.output()
    assert "refused POST /assistants/search: a wrong x-api-key" in log
    assert "k-first" not in log and "k-second" not in log and "k-third" not in log


def test_an_open_port_without_a_key_needs_insecure(api_server: ApiServer) -> None:
    api = api_server.start(
        "api", "--graph", GRAPHS, "--host", "0.0.0.0", "--port", str(free_port())
    )
    assert api.proc.wait(timeout=30) == 2
    assert "--insecure" in api.output() and "BULKSYNC_API_KEYS" in api.output()


def test_lost_redis_and_postgres_are_503_naming_them(api_server: ApiServer) -> None:
    redis_server, postgres = PrivateRedis(), PrivatePostgres()
    try:
        url, api = own_api(
            api_server,
            BULKSYNC_REDIS_URL=redis_server.url,
            BULKSYNC_DATABASE_URL=postgres.url,
            BULKSYNC_API_RETRY_WINDOW="0.5",
        )
        with httpx.Client(base_url=url, timeout=30) as http:
            thread_id = http.post("/threads", json={}).json()["thread_id"]
            redis_server.stop()
            answer = http.post(f"/threads/{thread_id}/runs", json=run(items=[1]))
            assert answer.status_code == 503 and "Redis at" in detail(answer)
            health = http.get("/health")
            assert health.status_code == 503 and "redis" in detail(health)
            postgres.stop()
            answer = http.get(f"/threads/{thread_id}")
            assert answer.status_code == 503 and "Postgres" in detail(answer)
            postgres.start()
            redis_server.start()
            assert http.get(f"/threads/{thread_id}").json()["status"] == "idle"
            assert http.get(f"/threads/{thread_id}/runs").json() == []  # nothing was queued
            assert http.get("/health").status_code == 200
        api.stop()
    finally:
        redis_server.close()
        postgres.close()
