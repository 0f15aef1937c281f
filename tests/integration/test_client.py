"""``Client`` and ``RemoteGraph`` against a coordinator service, compared with local runs."""

from __future__ import annotations

import asyncio
import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest

from bulksync import keys
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.client import Client, RemoteGraph
from bulksync.constants import NS_END
from bulksync.demo import build_demo_graph, demo_input
from bulksync.errors import ServiceUnavailableError
from bulksync.graph import END, START, StateGraph
from bulksync.service import events, runs
from bulksync.settings import Settings
from bulksync.types import Command, StateSnapshot, interrupt

from .test_service import WAIT, Service, chain_graph
from .test_service import service as service  # the fixture

pytestmark = pytest.mark.integration


# --- Client ---------------------------------------------------------------------------------


def test_stream_is_resumable_from_any_event_id(service: Service) -> None:
    graph_id = service.register(build_demo_graph().compile())
    service.start()
    run_id = service.client.submit(graph_id, demo_input(5), stream_mode=["updates", "values"])
    seen = list(service.client.stream(run_id))
    assert seen[-1].mode == events.END
    assert (seen[-1].chunk["status"], seen[-1].chunk["error"]) == ("success", None)
    updates = [e.chunk for e in seen if e.mode == "updates"]
    assert [next(iter(u)) for u in updates] == ["split", *["generate"] * 5, "summarize"]
    assert {e.mode for e in seen} == {"updates", "values", events.PROGRESS, events.END}
    for cut in (0, 3, len(seen) - 2):
        assert list(service.client.stream(run_id, last_event_id=seen[cut].id)) == seen[cut + 1 :]
    assert list(service.client.stream(run_id, last_event_id=seen[-1].id)) == []


def test_a_lost_end_event_is_made_up_from_the_row(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    service.start()
    run_id = service.client.submit(graph_id, {"log": []})
    assert service.client.wait(run_id, timeout=WAIT).status == runs.SUCCESS
    service.redis.delete(keys.events(run_id))  # expired, say
    (end,) = service.client.stream(run_id)
    assert (end.mode, end.chunk["status"], end.chunk["error"]) == (events.END, runs.SUCCESS, None)
    assert events.ended_run(end.chunk, run_id) == service.client.get(run_id)
    assert service.client.wait(run_id).status == runs.SUCCESS


def test_a_runs_end_event_gives_its_waiter_the_final_row(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph_id = service.register(chain_graph(service))
    service.start()
    run_id = service.client.submit(graph_id, {"log": []})
    *_, end = service.client.stream(run_id)
    final = service.client.get(run_id)
    assert final.status == runs.SUCCESS and final.output is not None

    def unread(run_id: str) -> runs.Run:
        raise AssertionError(f"run {run_id}: its row was read again")

    monkeypatch.setattr(service.client, "get", unread)  # Postgres is not asked again
    assert service.client.finished_run(run_id, end) == final


def test_progress_events_count_each_steps_tasks(service: Service) -> None:
    graph_id = service.register(build_demo_graph().compile())
    service.start()
    run_id = service.client.submit(graph_id, demo_input(6), stream_mode=[])
    progress = [e.chunk for e in service.client.stream(run_id) if e.mode == events.PROGRESS]
    last = {p["step"]: p for p in progress}
    assert [(p["done"], p["total"]) for p in last.values()] == [(1, 1), (6, 6), (1, 1)]
    assert list(last) == sorted(last)
    # Per node too (what the run view draws): the step's fan-out is one node's six tasks.
    for p in last.values():
        assert sum(n["total"] for n in p["nodes"].values()) == p["total"]
        assert all(n["done"] == n["total"] and n["failed"] == 0 for n in p["nodes"].values())
        assert p["elapsed_s"] >= 0
    assert [len(p["nodes"]) for p in last.values()] == [1, 1, 1]


def test_wait_gives_up_after_its_timeout(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    run_id = service.client.submit(graph_id, {"log": []}, require_coordinator=False)
    with pytest.raises(TimeoutError, match=rf"run {run_id} did not finish in time"):
        service.client.wait(run_id, timeout=0.2)
    assert service.client.get(run_id).status == runs.PENDING


def test_stream_of_a_cancelled_pending_run_ends(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    run_id = service.client.submit(graph_id, {"log": []}, require_coordinator=False)
    service.client.cancel(run_id)
    (end,) = service.client.stream(run_id)
    assert end.mode == events.END and end.chunk["status"] == runs.CANCELLED


def test_list_runs_by_thread_and_status(service: Service) -> None:
    graph_id = service.register(chain_graph(service))
    service.start()
    thread = f"t-{uuid.uuid4().hex[:6]}"
    ids = [service.client.submit(graph_id, {"log": []}, thread_id=thread) for _ in range(2)]
    for run_id in ids:
        service.client.wait(run_id, timeout=WAIT)
    listed = service.client.list_runs(thread_id=thread, status=runs.SUCCESS)
    assert [r.run_id for r in listed] == ids[::-1]
    assert service.client.list_runs(thread_id=thread, limit=1)[0].run_id == ids[-1]


def test_unknown_run_ids_are_named(service: Service) -> None:
    with pytest.raises(LookupError, match="no run 'nope'"):
        service.client.get("nope")
    with pytest.raises(LookupError, match="no run 'nope'"):
        service.client.cancel("nope")
    with pytest.raises(LookupError, match="no run 'nope'"):
        service.client.wait("nope", timeout=WAIT)
    with pytest.raises(LookupError, match="no run 'nope'"):
        next(service.client.stream("nope", timeout=WAIT))


def test_the_client_that_queued_a_run_follows_it_without_reading_its_row(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph_id = service.register(chain_graph(service))
    service.start()

    def unread(run_id: str) -> runs.Run:
        raise AssertionError(f"run {run_id}: its row was read")

    with Client(service.settings) as submitter:
        monkeypatch.setattr(submitter, "get", unread)
        first = submitter.submit(graph_id, {"log": []})
        assert submitter.wait(first, timeout=WAIT).status == runs.SUCCESS
        second = submitter.submit(graph_id, {"log": []})
        modes = [event.mode for event in submitter.stream(second, timeout=WAIT)]
        assert modes[-1] == events.END
        assert submitter.wait(second).status == runs.SUCCESS
    # Any other client finds them too.
    assert service.client.wait(first).status == runs.SUCCESS


@pytest.mark.parametrize(
    ("field", "url", "message"),
    [
        ("redis_url", "redis://127.0.0.1:1/0", r"cannot reach Redis at redis://127.0.0.1:1/0"),
        (
            "database_url",
            "postgresql://u:secret@127.0.0.1:1/db",
            r"Cannot connect to Postgres at postgresql://u:\*\*\*@127.0.0.1:1/db",
        ),
    ],
)
def test_unreachable_services_raise_one_clear_error(
    settings: Settings, field: str, url: str, message: str
) -> None:
    import dataclasses

    client = Client(dataclasses.replace(settings, **{field: url}))
    with client, pytest.raises(ServiceUnavailableError, match=message) as err:
        client.submit("g:graph", {})
    assert "secret" not in str(err.value) and len(str(err.value).splitlines()) == 1


# --- RemoteGraph equals the local graph -----------------------------------------------------


class Doc(TypedDict, total=False):
    """The state of the graphs compared below."""

    text: str
    notes: Annotated[list[str], operator.add]
    answer: str


def review_graph(checkpointer: Any = None) -> Any:
    """``draft`` → subgraph ``polish`` (``trim`` → ``shout``) → ``ask`` (interrupts)."""
    child: StateGraph[Doc] = StateGraph(Doc)
    child.add_node("trim", lambda s: {"text": s["text"].strip(), "notes": ["trim"]})
    child.add_node("shout", lambda s: {"text": s["text"].upper(), "notes": ["shout"]})
    child.add_edge(START, "trim")
    child.add_edge("trim", "shout")
    child.add_edge("shout", END)

    def ask(state: Doc) -> dict[str, Any]:
        return {"answer": interrupt(f"publish {state['text']}?"), "notes": ["ask"]}

    parent: StateGraph[Doc] = StateGraph(Doc)
    parent.add_node("draft", lambda s: {"text": f"  {s['text']} draft ", "notes": ["draft"]})
    parent.add_node("polish", child.compile())
    parent.add_node("ask", ask)
    parent.add_edge(START, "draft")
    parent.add_edge("draft", "polish")
    parent.add_edge("polish", "ask")
    parent.add_edge("ask", END)
    return parent.compile(checkpointer=checkpointer)


def strip_ids(value: Any) -> Any:
    """``value`` without what differs between two runs: checkpoint/task ids and timestamps."""
    if isinstance(value, StateSnapshot):
        fields = value._asdict()
        return strip_ids(
            {k: v for k, v in fields.items() if "config" not in k and k != "created_at"}
        )
    if isinstance(value, str) and NS_END in value:  # a namespace part: node:<task id>
        return value.split(NS_END)[0]
    if isinstance(value, dict):
        return {
            k: strip_ids(v)
            for k, v in value.items()
            if k not in ("checkpoint_id", "id", "timestamp", "parents", "thread_id", "run_id")
        }
    if isinstance(value, list | tuple):
        items = [strip_ids(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if hasattr(value, "__dataclass_fields__"):
        return strip_ids({f: getattr(value, f) for f in value.__dataclass_fields__})
    return value


@pytest.fixture
def pair(service: Service) -> tuple[Any, RemoteGraph]:
    """The review graph run locally (in memory) and on the cluster."""
    graph_id = service.register(review_graph())
    service.start()
    return review_graph(InMemorySaver()), RemoteGraph(graph_id, service.client, timeout=WAIT)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def test_remote_invoke_equals_local(pair: tuple[Any, RemoteGraph]) -> None:
    local, remote = pair
    want = local.invoke({"text": "x"}, config("r1"))
    assert want.keys() == {"text", "notes", "__interrupt__"}
    assert strip_ids(remote.invoke({"text": "x"}, config("r1"))) == strip_ids(want)
    got = remote.invoke({"text": "y"}, config("r3"), stream_mode="updates")
    assert strip_ids(got) == strip_ids(
        local.invoke({"text": "y"}, config("r3"), stream_mode="updates")
    )


def test_remote_resume_equals_local(pair: tuple[Any, RemoteGraph]) -> None:
    local, remote = pair
    for graph in pair:
        graph.invoke({"text": "x"}, config("r2"))
    assert remote.invoke(Command(resume="yes"), config("r2")) == local.invoke(
        Command(resume="yes"), config("r2")
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stream_mode": "values"},
        {"stream_mode": ["updates", "values", "custom"]},
        {"stream_mode": "updates", "subgraphs": True},
        {"stream_mode": ["values", "tasks"], "subgraphs": True},
    ],
    ids=repr,
)
def test_remote_stream_equals_local(pair: tuple[Any, RemoteGraph], kw: dict[str, Any]) -> None:
    local, remote = pair
    thread = f"s-{uuid.uuid4().hex[:6]}"
    want = [strip_ids(c) for c in local.stream({"text": "a"}, config(thread), **kw)]
    got = [strip_ids(c) for c in remote.stream({"text": "a"}, config(thread), **kw)]
    assert got == want


def test_remote_state_history_and_update_equal_local(pair: tuple[Any, RemoteGraph]) -> None:
    local, remote = pair
    for graph in pair:
        graph.invoke({"text": "doc"}, config("h"))
    assert strip_ids(remote.get_state(config("h"))) == strip_ids(local.get_state(config("h")))
    assert strip_ids(remote.get_state(config("h"), subgraphs=True)) == strip_ids(
        local.get_state(config("h"), subgraphs=True)
    )
    want = [strip_ids(s) for s in local.get_state_history(config("h"))]
    assert [strip_ids(s) for s in remote.get_state_history(config("h"))] == want
    assert [strip_ids(s) for s in remote.get_state_history(config("h"), limit=2)] == want[:2]
    updated = [g.update_state(config("h"), {"answer": "later"}, as_node="ask") for g in pair]
    assert updated[0]["configurable"].keys() == updated[1]["configurable"].keys()
    assert remote.get_state(config("h")).values == local.get_state(config("h")).values
    assert remote.get_state(updated[1]).values == local.get_state(updated[0]).values


def test_remote_errors_keep_their_type(service: Service) -> None:
    graph_id = service.register(chain_graph(service, fail=True))
    service.start()
    remote = RemoteGraph(graph_id, service.client, timeout=WAIT)
    with pytest.raises(KeyError, match="second failed on purpose"):
        remote.invoke({"log": []})
    chunks: list[Any] = []
    with pytest.raises(KeyError, match="second failed on purpose"):
        for chunk in remote.stream({"log": []}):
            chunks.append(chunk)
    assert chunks == [{"first": {"log": ["first"]}}]
    with pytest.raises(ValueError, match="Unknown stream_mode 'loud'"):
        list(remote.stream({"log": []}, stream_mode="loud"))


def test_remote_state_errors_keep_their_type(pair: tuple[Any, RemoteGraph]) -> None:
    local, remote = pair
    for graph in pair:
        graph.invoke({"text": "doc"}, config("e"))
    bad_ns = {"configurable": {"thread_id": "e", "checkpoint_ns": "nowhere:1"}}
    calls = [
        lambda g: g.update_state(config("e"), {"text": "x"}, as_node="no_such_node"),
        lambda g: g.update_state(bad_ns, {"text": "x"}),  # "Subgraph nowhere not found"
    ]
    for call in calls:
        with pytest.raises(Exception) as want:
            call(local)
        with pytest.raises(type(want.value)) as got:
            call(remote)
        assert str(got.value) == str(want.value)
    # A namespace naming no subgraph reads with the graph's own channels, as in LangGraph:
    # nothing was stored there.
    assert local.get_state(bad_ns).values == remote.get_state(bad_ns).values == {}
    assert list(local.get_state_history(bad_ns)) == list(remote.get_state_history(bad_ns)) == []


def test_cancelling_a_remote_ainvoke_cancels_its_run(service: Service) -> None:
    graph_id = service.register(chain_graph(service, gate="never"))
    service.start()
    remote = RemoteGraph(graph_id, service.client, timeout=WAIT)
    config = {"configurable": {"thread_id": "cancelled-caller"}}

    async def call() -> None:
        await asyncio.wait_for(remote.ainvoke({"log": []}, config), 0.5)

    with pytest.raises(TimeoutError):
        asyncio.run(call())
    (run,) = service.client.list_runs(thread_id="cancelled-caller")
    service.open_gate("never")  # free the worker thread, if the run got that far
    assert service.client.wait(run.run_id, timeout=WAIT).status == runs.CANCELLED
