"""Human approval of an agent's action: ``python examples/approval.py [yes|no]``.

A support agent may issue refunds, but not on its own say-so. When its model proposes a call
of ``issue_refund``, the graph goes to ``review`` instead of the tools: ``review`` pauses the
run with ``interrupt(...)``, showing the proposed calls and asking "approve?". The run is
checkpointed and waits — for seconds or days. ``Command(resume="yes")`` approves: ``review``
runs again, its ``interrupt`` returns the answer, and the calls go to ``tools``. Any other
answer rejects: ``review`` answers each call itself ("rejected by a reviewer"), never running
it, and the agent tells the customer it did not refund. ::

    python examples/approval.py        # run to the pause, print it, resume with "yes"
    python examples/approval.py no     # the same, rejected

On a cluster the paused run's checkpoint is in Postgres, so the answer may come from another
machine, much later; ``bulksync resume`` runs the thread on whichever workers are up::

    PYTHONPATH=. bulksync worker --graph examples.approval:graph
    PYTHONPATH=. bulksync coordinator --graph examples.approval:graph
    bulksync submit examples.approval:graph --thread refund-1 --wait \\
        --input '{"messages": [["user", "Please refund order 1234, it arrived broken: 49.90 EUR"]]}'
    bulksync resume refund-1 --graph examples.approval:graph --value '"yes"' --wait

The model is scripted (``examples/_models.py``; ``BULKSYNC_EXAMPLE_MODEL`` names a real one).
Needs the ``agents`` extra. ``graph`` is compiled with an in-memory checkpointer (a pause
needs a thread) for the in-process demo; on a cluster the coordinator checkpoints to Postgres.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

if not __package__:  # run as a script: ``examples.*`` imports from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.graph import END, START, MessagesState, StateGraph
from bulksync.prebuilt import ToolNode
from bulksync.types import Command, interrupt
from examples._models import calls, chat_model, question, results, say

REQUEST = "Please refund order 1234, it arrived broken: 49.90 EUR"
APPROVALS = {"yes", "y", "approve", "approved", "ok"}
"""Answers that approve (in any case); anything else rejects."""
REJECTED = "Rejected by a reviewer: not run. Do not retry; tell the customer."

PROMPT = (
    "You are a customer support agent. To refund an order, call issue_refund; a human "
    "reviews each refund first. If a refund is rejected, do not retry: tell the customer."
)


@tool
def issue_refund(order_id: str, amount: float) -> str:
    """Refund ``amount`` EUR of order ``order_id`` to the customer."""
    return f"Refunded {amount:.2f} EUR for order {order_id} (refund REF-{order_id})."


def script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted agent: propose the refund the request asks for, then report how it went."""
    answered = results(messages, "issue_refund")
    if answered:
        done = answered[-1]
        if done.status == "error":
            return say("I have not issued the refund: a reviewer declined it. We will be in touch.")
        return say(f"Done. {done.content}")
    text = question(messages)
    order = re.search(r"order #?(\w+)", text)
    amount = re.search(r"(\d+(?:[.,]\d+)?) ?(?:EUR|€)", text)
    if not (order and amount):
        return say("Which order should I refund, and how much?")
    args = {"order_id": order.group(1), "amount": float(amount.group(1).replace(",", "."))}
    return calls(("issue_refund", args))


def build_graph(checkpointer: Any = None) -> Any:
    """agent → review (pauses) → tools → agent, or review → agent when rejected."""
    model = chat_model(script).bind_tools([issue_refund])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([SystemMessage(PROMPT), *state["messages"]])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("review", review, destinations=("tools", "agent"))
    builder.add_node("tools", ToolNode([issue_refund]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", proposed, ["review", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer, name="approval")


def proposed(state: MessagesState) -> str:
    """After the agent: review the calls it proposes; none, and it has answered."""
    last = state["messages"][-1]
    return "review" if isinstance(last, AIMessage) and last.tool_calls else END


def review(state: MessagesState) -> Command[Any]:
    """Pause for a human's verdict on the proposed calls; run them only when approved."""
    proposal = state["messages"][-1]
    assert isinstance(proposal, AIMessage)
    wanted = [{"name": c["name"], "args": c["args"]} for c in proposal.tool_calls]
    verdict = interrupt({"question": "Approve these calls? (yes/no)", "tool_calls": wanted})
    if str(verdict).strip().lower() in APPROVALS:
        return Command(goto="tools")
    answers = [
        ToolMessage(REJECTED, name=c["name"], tool_call_id=c["id"], status="error")
        for c in proposal.tool_calls
    ]
    return Command(goto="agent", update={"messages": answers})


graph = build_graph(InMemorySaver())
"""The graph workers and coordinators load: ``--graph examples.approval:graph``."""


def main(answer: str = "yes", request: str = REQUEST, thread_id: str = "refund-1") -> None:
    """Run to the pause in-process, print what it asks, resume with ``answer``."""
    config = {"configurable": {"thread_id": thread_id}}
    paused = graph.invoke({"messages": [("user", request)]}, config)
    if "__interrupt__" not in paused:  # nothing to approve: the agent answered at once
        print(paused["messages"][-1].content)
        return
    for pending in paused["__interrupt__"]:
        print(f"paused: {pending.value}")
    print(f"answer: {answer!r}")
    print(graph.invoke(Command(resume=answer), config)["messages"][-1].content)


if __name__ == "__main__":
    main(*sys.argv[1:2], *([" ".join(sys.argv[2:])] if sys.argv[2:] else []))
