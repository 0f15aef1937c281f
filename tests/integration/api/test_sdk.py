"""LangGraph's own clients against ``bulksync api`` on a real cluster.

langgraph-sdk's ``get_sync_client`` and LangGraph's ``RemoteGraph(url=...)`` run a ``Send``
fan-out, stream it, pause on an interrupt and resume it, read state and history, update
state and cancel a run — each answer compared with what the same graph gives in-process.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.types import Command as LocalCommand
from tests.integration.api import graphs
from tests.integration.api.conftest import APPROVAL, FANOUT, NESTED, ApiServer

pytestmark = pytest.mark.integration


def local(graph: Any) -> Any:
    """The graph in-process with a memory saver: the reference answers."""
    return graph.builder.compile(checkpointer=InMemorySaver())


def new_thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


# -- langgraph-sdk ----------------------------------------------------------------------------


def test_sdk_streams_a_send_fanout_as_the_graph_streams_it(sdk: Any) -> None:
    client = sdk
    thread = client.threads.create()
    parts = list(
        client.runs.stream(
            thread["thread_id"], FANOUT, input={"items": [1, 2, 3]}, stream_mode="updates"
        )
    )
    assert parts[0].event == "metadata" and parts[0].data["run_id"]
    updates = [p.data for p in parts if p.event == "updates"]
    expected = list(
        local(graphs.fanout).stream({"items": [1, 2, 3]}, new_thread(), stream_mode="updates")
    )
    key = lambda u: repr(u)  # noqa: E731 - the fan-out's tasks finish in any order
    assert sorted(updates, key=key) == sorted(expected, key=key)
    assert all(p.id for p in parts[1:])  # each event carries its id, to resume after
    state = client.threads.get_state(thread["thread_id"])
    assert state["values"] == {"items": [1, 2, 3], "squares": [1, 4, 9], "total": 14}
    assert state["next"] == [] and state["checkpoint"]["thread_id"] == thread["thread_id"]
    assert client.threads.get(thread["thread_id"])["status"] == "idle"


def test_sdk_pauses_on_an_interrupt_and_resumes_with_a_command(sdk: Any) -> None:
    client = sdk
    thread_id = client.threads.create()["thread_id"]
    paused = client.runs.wait(thread_id, APPROVAL, input={"text": "ship it"})
    [pending] = paused["__interrupt__"]
    assert pending["value"] == {"question": "approve?", "text": "ship it"}
    thread = client.threads.get(thread_id)
    assert thread["status"] == "interrupted"
    assert [i["value"] for [i] in thread["interrupts"].values()] == [pending["value"]]
    state = client.threads.get_state(thread_id)
    assert (
        state["next"] == ["approve"] and state["tasks"][0]["interrupts"][0]["id"] == pending["id"]
    )
    done = client.runs.wait(thread_id, APPROVAL, command={"resume": "yes"})
    assert done == {"text": "ship it", "decision": "yes", "log": ["drafted ship it", "decided yes"]}
    history = client.threads.get_history(thread_id, limit=20)
    assert history[0]["values"] == done and len(history) >= 4
    runs = client.runs.list(thread_id)
    assert [r["status"] for r in runs] == ["success", "interrupted"]


def test_sdk_updates_state_and_reads_it_at_a_checkpoint(sdk: Any) -> None:
    client = sdk
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, FANOUT, input={"items": [2]})
    before = client.threads.get_state(thread_id)
    updated = client.threads.update_state(thread_id, {"total": 100}, as_node="sum")
    assert updated["checkpoint"]["checkpoint_id"] != before["checkpoint"]["checkpoint_id"]
    assert client.threads.get_state(thread_id)["values"]["total"] == 100
    old = client.threads.get_state(thread_id, checkpoint_id=before["checkpoint"]["checkpoint_id"])
    assert old["values"]["total"] == 4
    # The update is not one of the thread's runs.
    assert [r["status"] for r in client.runs.list(thread_id)] == ["success"]


def test_sdk_cancels_a_running_run(sdk: Any) -> None:
    client = sdk
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, FANOUT, input={"items": [1, 2], "seconds": 2.0})
    client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert client.runs.get(thread_id, run["run_id"])["status"] == "interrupted"
    assert client.threads.get(thread_id)["status"] == "idle"


def test_sdk_stream_resumes_after_the_last_event_id(sdk: Any) -> None:
    client = sdk
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, FANOUT, input={"items": [1, 2]}, stream_mode="values")
    everything = list(client.runs.join_stream(thread_id, run["run_id"]))
    ids = [p.id for p in everything if p.id]
    rest = list(client.runs.join_stream(thread_id, run["run_id"], last_event_id=ids[0]))
    assert [p.data for p in rest] == [p.data for p in everything if p.id][1:]
    assert rest[-1].data == {"items": [1, 2], "squares": [1, 4], "total": 5}


def test_sdk_runs_without_a_thread(sdk: Any) -> None:
    client = sdk
    assert client.runs.wait(None, FANOUT, input={"items": [3]})["total"] == 9
    parts = list(client.runs.stream(None, FANOUT, input={"items": [4]}, stream_mode="values"))
    assert parts[-1].data["total"] == 16


def test_sdk_lists_assistants_and_draws_their_graph(sdk: Any) -> None:
    client = sdk
    found = {a["graph_id"]: a for a in client.assistants.search()}
    assert set(found) == {FANOUT, APPROVAL, NESTED}
    assert client.assistants.get(found[FANOUT]["assistant_id"])["graph_id"] == FANOUT
    drawing = client.assistants.get_graph(FANOUT)
    assert {n["id"] for n in drawing["nodes"]} == {"__start__", "square", "sum", "__end__"}
    assert {"source": "__start__", "target": "square", "conditional": True} in drawing["edges"]
    schemas = client.assistants.get_schemas(FANOUT)
    assert set(schemas["state_schema"]["properties"]) == {"items", "seconds", "squares", "total"}


# -- RemoteGraph(url=...) ------------------------------------------------------------------------


def test_remote_graph_invokes_and_streams_like_the_local_graph(remote: Any) -> None:
    graph = remote(FANOUT)
    reference = local(graphs.fanout)
    value = {"items": [5, 6]}
    assert graph.invoke(value, new_thread()) == reference.invoke(value, new_thread())
    chunks = list(graph.stream(value, new_thread(), stream_mode="values"))
    assert chunks == list(reference.stream(value, new_thread(), stream_mode="values"))


def test_remote_graph_interrupt_state_history_and_resume(remote: Any) -> None:
    from langgraph.types import Command

    graph = remote(APPROVAL)
    reference = local(graphs.approval)
    config, mine = new_thread(), new_thread()
    paused = graph.invoke({"text": "x"}, config)
    expected = reference.invoke({"text": "x"}, mine)
    assert paused["log"] == expected["log"]
    # RemoteGraph.invoke hands the last values event on as it came: interrupts as JSON.
    asked = [i.value for i in expected["__interrupt__"]]
    assert [i["value"] for i in paused["__interrupt__"]] == asked
    state = graph.get_state(config)
    assert state.next == ("approve",) and state.values == reference.get_state(mine).values
    answer = reference.invoke(LocalCommand(resume="no"), mine)
    assert graph.invoke(Command(resume="no"), config) == answer
    history = list(graph.get_state_history(config))
    assert [h.next for h in history] == [h.next for h in reference.get_state_history(mine)]
    graph.update_state(config, {"decision": "maybe"})
    assert graph.get_state(config).values["decision"] == "maybe"
    assert graph.get_graph().draw_mermaid() == reference.get_graph().draw_mermaid()


def test_a_thread_stream_follows_every_later_run(api_server: ApiServer, sdk: Any) -> None:
    thread_id = sdk.threads.create()["thread_id"]
    sdk.runs.wait(thread_id, FANOUT, input={"items": [1]})  # before the stream: not in it
    opened = threading.Event()
    seen: list[tuple[str, Any]] = []

    def follow() -> None:
        # What langgraph-sdk's threads.join_stream asks; read here to know when it is open.
        with api_server.http() as http, http.stream("GET", f"/threads/{thread_id}/stream") as sse:
            opened.set()
            event = ""
            for line in sse.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    seen.append((event, json.loads(line.removeprefix("data: "))))
                    if sum(1 for e, _ in seen if e == "metadata") == 2:
                        return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert opened.wait(30)
    first = sdk.runs.create(thread_id, FANOUT, input={"items": [2]}, stream_mode="values")
    second = sdk.runs.create(thread_id, FANOUT, input={"items": [3]}, stream_mode="values")
    follower.join(timeout=60)
    assert not follower.is_alive()
    done = [data["run_id"] for event, data in seen if event == "metadata"]
    assert done == [first["run_id"], second["run_id"]]
    # Each run's last values come just before its run_done.
    last = [seen[i - 1][1]["total"] for i, (event, _) in enumerate(seen) if event == "metadata"]
    assert last == [5, 14] and {event for event, _ in seen} == {"values", "metadata"}


def test_sdk_reads_a_paused_subgraphs_state(sdk: Any) -> None:
    thread_id = sdk.threads.create()["thread_id"]
    paused = sdk.runs.wait(thread_id, NESTED, input={"text": "deep"})
    assert paused["__interrupt__"][0]["value"]["text"] == "deep"
    flat = sdk.threads.get_state(thread_id)
    [task] = flat["tasks"]
    assert task["name"] == "review" and task["state"] is None
    assert task["checkpoint"]["checkpoint_ns"].startswith("review:")
    deep = sdk.threads.get_state(thread_id, subgraphs=True)
    inner = deep["tasks"][0]["state"]
    assert inner["next"] == ["approve"] and inner["values"]["log"] == ["drafted deep"]
    # The subgraph's own checkpoint, by its namespace.
    at = sdk.threads.get_state(thread_id, checkpoint=task["checkpoint"])
    assert at["values"] == inner["values"]
    done = sdk.runs.wait(thread_id, NESTED, command={"resume": "ok"})
    assert done["log"] == ["drafted deep", "decided ok", "wrapped"]


def test_the_api_describes_itself(api_server: ApiServer) -> None:
    with api_server.http() as http:
        spec = http.get("/openapi.json").json()
        assert "/threads/{thread_id}/runs/stream" in spec["paths"]
        assert http.get("/docs").status_code == 200
        info = http.get("/info").json()
        assert FANOUT in info["graphs"] and info["version"]
