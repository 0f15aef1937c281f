"""A supervisor routing questions to prebuilt ReAct agents: ``python examples/supervisor.py``.

The supervisor reads the question and hands it to a specialist — a math agent with
``add``/``multiply`` tools, or a research agent with a ``search`` tool — each built by
``bulksync.prebuilt.create_react_agent`` and added as a node (a subgraph). When the specialist
has answered, the supervisor ends the run. On a cluster every model call and every tool call
is a task a worker runs, and a model's parallel tool calls run on as many workers::

    PYTHONPATH=. bulksync worker --graph examples.supervisor:graph
    PYTHONPATH=. bulksync coordinator --graph examples.supervisor:graph
    bulksync submit examples.supervisor:graph --wait \\
        --input '{"messages": [["user", "what is 6 times 7, plus 8 times 9?"]]}'

The models are scripted (``examples/_models.py``): deterministic, no API key, and they decide
from the conversation itself, so the same graph answers every run the same way. Set
``BULKSYNC_EXAMPLE_MODEL`` (e.g. ``openai:gpt-4o-mini``, with ``pip install langchain
langchain-openai``) to run the agents on a real model instead. Needs the ``agents`` extra
(``pip install 'bulksync[agents]'``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

if not __package__:  # run as a script: ``examples.*`` imports from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bulksync.graph import END, START, MessagesState, StateGraph
from bulksync.prebuilt import create_react_agent
from bulksync.types import Command
from examples._models import chat_model, question, results
from examples._tools import add, multiply, search

MATH_PROMPT = "You are a math agent: answer with your add and multiply tools, then the result."
RESEARCH_PROMPT = "You are a research agent: look the topic up with search, then answer briefly."


def script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """Both agents' scripted model: asked a question, it calls its tools — ``multiply`` for
    each "A times B", ``search`` otherwise (all calls in one message, so they run in
    parallel); once every call is answered it replies with the answers, summed when there are
    several products."""
    answers = results(messages, *tools)
    return _answer(answers) if answers else _calls(question(messages), tools)


def _calls(asked: str, tools: tuple[str, ...]) -> AIMessage:
    """The tool calls a question asks for (none: a reply saying so)."""
    calls: list[dict[str, Any]] = []
    if "multiply" in tools:
        for i, (a, b) in enumerate(re.findall(r"(\d+) times (\d+)", asked)):
            calls.append({"name": "multiply", "args": {"a": int(a), "b": int(b)}, "id": f"m{i}"})
    if "search" in tools and not calls:
        calls.append({"name": "search", "args": {"query": asked}, "id": "s0"})
    if not calls:
        return AIMessage(content="I have no tool for that question.")
    return AIMessage(content="", tool_calls=calls)


def _answer(answers: list[ToolMessage]) -> AIMessage:
    values = [str(m.content) for m in answers]
    if len(values) > 1 and all(v.lstrip("-").isdigit() for v in values):
        total = sum(int(v) for v in values)
        return AIMessage(content=f"{' + '.join(values)} = {total}")
    return AIMessage(content=" ".join(values))


math_agent = create_react_agent(
    chat_model(script), [add, multiply], prompt=MATH_PROMPT, name="math_agent"
)
research_agent = create_react_agent(
    chat_model(script), [search], prompt=RESEARCH_PROMPT, name="research_agent"
)


def supervisor(state: MessagesState) -> Command[Any]:
    """Send the question to the specialist it needs; end once the specialist answered."""
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and not last.tool_calls:
        return Command(goto=END)
    asked = question(state["messages"])
    specialist = "math_agent" if re.search(r"\d+ times \d+", asked) else "research_agent"
    return Command(goto=specialist)


def build_graph() -> Any:
    """The supervisor graph: supervisor → a specialist agent → supervisor → END."""
    builder = StateGraph(MessagesState)
    builder.add_node("supervisor", supervisor, destinations=("math_agent", "research_agent", END))
    builder.add_node("math_agent", math_agent)
    builder.add_node("research_agent", research_agent)
    builder.add_edge(START, "supervisor")
    builder.add_edge("math_agent", "supervisor")
    builder.add_edge("research_agent", "supervisor")
    return builder.compile(name="supervisor")


graph = build_graph()
"""The graph workers and coordinators load: ``--graph examples.supervisor:graph``."""


def main(question: str) -> None:
    """Run the supervisor in-process on ``question`` and print the conversation."""
    for message in graph.invoke({"messages": [("user", question)]})["messages"]:
        calls = getattr(message, "tool_calls", None)
        print(f"{type(message).__name__}: {message.content or calls}")


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "what is 6 times 7, plus 8 times 9?")
