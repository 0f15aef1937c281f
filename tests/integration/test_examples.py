"""The examples run on the cluster with the answers they give in-process."""

from __future__ import annotations

from typing import Any

import pytest

from bulksync.client import RemoteGraph

from .test_service import WAIT, Service
from .test_service import service as service  # the fixture

pytestmark = pytest.mark.integration

supervisor = pytest.importorskip("examples.supervisor")

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
