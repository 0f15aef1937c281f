"""Human-in-the-loop on the cluster: each ``Command(resume=…)`` answers exactly one question.

A node that calls ``interrupt()`` several times runs again from its start on each resume; the
answers it already has are replayed in order and the run-wide answer of the latest
``Command(resume=v)`` goes to the first question still open, once. The attached Celery
executor must ask and answer exactly as the in-process loop does (which matches LangGraph),
however many workers see the answer.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.client import RemoteGraph
from bulksync.graph import END, START, StateGraph
from bulksync.types import Command, Send, interrupt

from .test_service import WAIT, Service
from .test_service import service as service  # the fixture

pytestmark = pytest.mark.integration


class Form(TypedDict, total=False):
    answers: Annotated[list[str], operator.add]


def three_questions(state: Form) -> Form:
    return {"answers": [interrupt(f"question {n}") for n in (1, 2, 3)]}


def questions_graph() -> Any:
    builder = StateGraph(Form)
    builder.add_node("ask", three_questions)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=InMemorySaver())


def conversation(graph: Any, thread: str, replies: list[str]) -> list[Any]:
    """What the caller sees: the first invoke, then one resume per reply, and the state."""
    config = {"configurable": {"thread_id": thread}}
    first = graph.invoke({"answers": []}, config)
    seen: list[Any] = [[i.value for i in first["__interrupt__"]]]
    for reply in replies:
        out = graph.invoke(Command(resume=reply), config)
        seen.append({k: v for k, v in out.items() if k != "__interrupt__"})
        seen.append([i.value for i in out.get("__interrupt__", ())])
    state = graph.get_state(config)
    seen.append((state.values, state.next, [i.value for i in state.interrupts]))
    return seen


def test_each_resume_answers_one_question(cluster: Any) -> None:
    local = questions_graph()
    remote = cluster.attach(questions_graph())
    replies = ["A", "B", "C"]
    expected = conversation(local, "local", replies)
    # In-process (LangGraph's answer): one question at a time, then the three answers.
    assert expected[1:3] == [{"answers": []}, ["question 2"]]
    assert expected[-1] == ({"answers": ["A", "B", "C"]}, (), [])
    assert conversation(remote, "remote", replies) == expected


def test_each_resume_answers_one_question_through_the_service(service: Service) -> None:
    graph_id = service.register(questions_graph())
    service.start()
    remote = RemoteGraph(graph_id, service.client, timeout=WAIT)
    replies = ["A", "B", "C"]
    assert conversation(remote, "remote", replies) == conversation(
        questions_graph(), "local", replies
    )


class Loop(TypedDict, total=False):
    draft: int
    verdicts: Annotated[list[str], operator.add]


def write(state: Loop) -> Loop:
    return {"draft": state.get("draft", 0) + 1}


def approve(state: Loop) -> Command[Any]:
    verdict = interrupt(f"approve draft {state['draft']}?")
    goto = END if verdict == "approve" else "write"
    return Command(update={"verdicts": [f"{state['draft']}:{verdict}"]}, goto=goto)


def supervisor_graph() -> Any:
    builder = StateGraph(Loop)
    builder.add_node("write", write)
    builder.add_node("approve", approve, destinations=("write", END))
    builder.add_edge(START, "write")
    builder.add_edge("write", "approve")
    return builder.compile(checkpointer=InMemorySaver())


def test_a_rejection_loops_once_and_asks_again(cluster: Any) -> None:
    """One "reject" sends the draft back once; the next review is a new question."""

    def drive(graph: Any) -> list[Any]:
        config = {"configurable": {"thread_id": "review"}}
        outs = [graph.invoke({"verdicts": []}, config, recursion_limit=12)]
        for reply in ["reject", "reject", "approve"]:
            outs.append(graph.invoke(Command(resume=reply), config, recursion_limit=12))
        return [
            ([i.value for i in out.get("__interrupt__", ())], out.get("verdicts")) for out in outs
        ]

    expected = drive(supervisor_graph())
    assert expected[-1] == ([], ["1:reject", "2:reject", "3:approve"])
    assert drive(cluster.attach(supervisor_graph())) == expected


class Review(TypedDict, total=False):
    drafts: list[str]
    verdicts: Annotated[list[str], operator.add]


def review(task: dict[str, Any]) -> Review:
    first = interrupt(f"approve {task['draft']}?")
    second = interrupt(f"sure about {task['draft']}?")
    return {"verdicts": [f"{task['draft']}:{first}/{second}"]}


def fan_out(state: Review) -> list[Send]:
    return [Send("review", {"draft": d}) for d in state["drafts"]]


def test_parallel_interrupts_answered_by_id(cluster: Any) -> None:
    def build() -> Any:
        builder = StateGraph(Review)
        builder.add_node("review", review)
        builder.add_conditional_edges(START, fan_out, ["review"])
        builder.add_edge("review", END)
        return builder.compile(checkpointer=InMemorySaver())

    def drive(graph: Any) -> list[Any]:
        config = {"configurable": {"thread_id": "t"}}
        out = graph.invoke({"drafts": ["x", "y"]}, config)
        seen: list[Any] = []
        while "__interrupt__" in out:
            asked = sorted(out["__interrupt__"], key=lambda i: i.value)
            seen.append([i.value for i in asked])
            answers = {i.id: f"ok{len(seen)}-{i.value.split()[-1].rstrip('?')}" for i in asked}
            out = graph.invoke(Command(resume=answers), config)
        seen.append(sorted(out["verdicts"]))
        return seen

    expected = drive(build())
    assert expected[-1] == ["x:ok1-x/ok2-x", "y:ok1-y/ok2-y"]
    assert drive(cluster.attach(build())) == expected
