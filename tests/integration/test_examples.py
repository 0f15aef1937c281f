"""The examples run on the cluster with the answers they give in-process.

Each runs through a coordinator service and ``RemoteGraph`` (the supervisor attached to the
Celery executor too) on its scripted models, so the answers are known exactly.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.client import RemoteGraph
from bulksync.types import Command

from .test_service import WAIT, Service
from .test_service import service as service  # the fixture

pytestmark = pytest.mark.integration

supervisor = pytest.importorskip("examples.supervisor")
swarm = pytest.importorskip("examples.swarm")
hierarchical = pytest.importorskip("examples.hierarchical")
collaborative = pytest.importorskip("examples.collaborative")
approval = pytest.importorskip("examples.approval")
models = pytest.importorskip("examples._models")
map_reduce = pytest.importorskip("examples.map_reduce")

QUESTIONS = ["what is 6 times 7, plus 8 times 9?", "what is celery?"]


def conversation(output: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (type(m).__name__, m.content or [c["name"] for c in m.tool_calls])
        for m in output["messages"]
    ]


@pytest.mark.parametrize("question", QUESTIONS)
def test_supervisor_of_prebuilt_agents_on_workers(cluster: Any, question: str) -> None:
    local = conversation(supervisor.graph.invoke({"messages": [("user", question)]}))
    attached = cluster.attach(supervisor.build_graph())
    assert conversation(attached.invoke({"messages": [("user", question)]})) == local
    assert local[-1][0] == "AIMessage" and local[-1][1]  # the specialist's answer


def test_supervisor_through_the_service(service: Service) -> None:
    graph_id = service.register(supervisor.build_graph())
    service.start()
    remote = RemoteGraph(graph_id, service.client, timeout=WAIT)
    question = QUESTIONS[0]
    out = remote.invoke({"messages": [("user", question)]})
    assert conversation(out)[-1] == ("AIMessage", "42 + 72 = 114")


def remote_graph(service: Service, graph: Any) -> RemoteGraph:
    """``graph`` served by the service's coordinator and the session's worker."""
    graph_id = service.register(graph)
    service.start()
    return RemoteGraph(graph_id, service.client, timeout=WAIT)


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": f"{name}-{uuid.uuid4().hex[:8]}"}}


def turn(output: dict[str, Any]) -> list[tuple[str, Any]]:
    """The messages of the latest turn: from the user's latest message on."""
    said = conversation(output)
    start = max(i for i, (kind, _) in enumerate(said) if kind == "HumanMessage")
    return said[start:]


def test_swarm_hands_off_and_the_next_turn_goes_to_the_active_agent(service: Service) -> None:
    remote = remote_graph(service, swarm.build_graph())
    local, local_config = swarm.build_graph(InMemorySaver()), thread("local")
    config = thread("trip")
    for text in swarm.TURNS:
        want = local.invoke({"messages": [("user", text)]}, local_config)
        out = remote.invoke({"messages": [("user", text)]}, config)
        assert conversation(out) == conversation(want)
        assert out["active_agent"] == want["active_agent"] == "hotel_agent"
    first, second = swarm.TURNS
    # The flight agent (the default) handed the first turn over; the hotel agent, active
    # since, took the second at once (the flight agent would have searched flights).
    assert [kind_or_calls for _, kind_or_calls in turn(out)][1:3] == [
        ["search_hotels"],
        "Hotels in Paris at most 150 EUR a night: Le Petit Quai (95 EUR a night), "
        "Hotel Lumiere (140 EUR a night).",
    ]
    history = conversation(out)
    assert history[1] == ("AIMessage", ["transfer_to_hotel_agent"])
    assert ("HumanMessage", first) in history and history[-4] == ("HumanMessage", second)
    assert history[-1][1] == history[-2][1]  # the agent's answer is the tool's finding


def test_map_reduce_fans_out_on_the_cluster(service: Service) -> None:
    from bulksync.demo import build_demo_graph, demo_input

    remote = remote_graph(service, build_demo_graph().compile())
    out = remote.invoke(demo_input(6))
    assert out == map_reduce.graph.invoke(demo_input(6))
    assert len(out["jokes"]) == 6 and out["best_joke"] in out["jokes"]


def test_hierarchical_teams_write_the_report(service: Service) -> None:
    remote = remote_graph(service, hierarchical.build_graph())
    question = {"messages": [("user", hierarchical.QUESTION)]}
    out = remote.invoke(question)
    assert conversation(out) == conversation(hierarchical.graph.invoke(question))
    assert out["messages"][-1].content == (
        "Report (17 words):\n"
        "- Pregel is Google's bulk-synchronous graph system (Malewicz et al., 2010).\n"
        "- 6 times 7 is 42."
    )
    # Each level's workers ran in order: look-ups, arithmetic, outline, word count.
    calls = [names for kind, names in conversation(out) if isinstance(names, list)]
    assert calls == [["search"], ["multiply"], ["outline"], ["count_words"]]


def test_collaborating_agents_end_on_the_final_answer(service: Service) -> None:
    remote = remote_graph(service, collaborative.build_graph())
    question = {"messages": [("user", collaborative.QUESTION)]}
    out = remote.invoke(question)
    assert conversation(out) == conversation(collaborative.graph.invoke(question))
    assert out["messages"][-1].content == (
        "FINAL ANSWER\n"
        "Berlin | #################### 3.8 million\n"
        "Madrid | ################## 3.4 million\n"
        "Paris  | ########### 2.1 million"
    )
    speakers = [m.name for m in out["messages"] if m.type == "ai"]
    assert speakers == ["researcher", "researcher", "chart_writer", "chart_writer"]
    assert out["sender"] == "chart_writer"


@pytest.mark.parametrize(
    ("answer", "final"),
    [
        ("yes", "Done. Refunded 49.90 EUR for order 1234 (refund REF-1234)."),
        ("no", "I have not issued the refund: a reviewer declined it. We will be in touch."),
    ],
    ids=["approved", "rejected"],
)
def test_approval_pauses_and_runs_the_action_only_when_approved(
    service: Service, answer: str, final: str
) -> None:
    remote = remote_graph(service, approval.build_graph())
    local, local_config = approval.build_graph(InMemorySaver()), thread("local")
    request = {"messages": [("user", approval.REQUEST)]}
    config = thread("refund")
    paused = remote.invoke(request, config)
    (pending,) = paused["__interrupt__"]
    assert pending.value == {
        "question": "Approve these calls? (yes/no)",
        "tool_calls": [{"name": "issue_refund", "args": {"order_id": "1234", "amount": 49.9}}],
    }
    assert remote.get_state(config).next == ("review",)
    local_paused = local.invoke(request, local_config)
    assert [i.value for i in local_paused["__interrupt__"]] == [pending.value]

    out = remote.invoke(Command(resume=answer), config)
    assert conversation(out) == conversation(local.invoke(Command(resume=answer), local_config))
    assert out["messages"][-1].content == final
    refunded = [m.content for m in out["messages"] if m.type == "tool"]
    if answer == "yes":
        assert refunded == ["Refunded 49.90 EUR for order 1234 (refund REF-1234)."]
    else:  # the tool never ran: the reviewer's rejection answered the call
        assert refunded == [approval.REJECTED]
    assert "__interrupt__" not in out and remote.get_state(config).next == ()


def test_a_real_model_without_langchain_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(models.MODEL_VARIABLE, "openai:gpt-4o-mini")
    monkeypatch.setitem(sys.modules, "langchain", None)  # as if not installed: no network
    monkeypatch.setitem(sys.modules, "langchain.chat_models", None)
    with pytest.raises(SystemExit, match="pip install langchain langchain-openai"):
        models.chat_model(approval.script)
