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

The models are scripted (``ScriptedChatModel``): deterministic, no API key, and they decide
from the conversation itself, so the same graph answers every run the same way. Swap in a
real chat model (any LangChain ``BaseChatModel`` that supports tool calling) to use it for
real. Needs the ``agents`` extra (``pip install 'bulksync[agents]'``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from bulksync.graph import END, START, MessagesState, StateGraph
from bulksync.prebuilt import create_react_agent
from bulksync.types import Command

FACTS = {
    "pregel": "Pregel is Google's bulk-synchronous graph system (Malewicz et al., 2010).",
    "celery": "Celery is a distributed task queue for Python, first released in 2009.",
}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
def search(query: str) -> str:
    """Look a topic up in the (tiny, offline) encyclopedia."""
    hits = [fact for topic, fact in FACTS.items() if topic in query.lower()]
    return " ".join(hits) or f"Nothing found about {query!r}."


class ScriptedChatModel(BaseChatModel):
    """A deterministic tool-calling chat model for examples and tests.

    Asked a question, it calls its tools: ``multiply`` for each "A times B" and ``search`` for
    a "who/what is" question (all calls in one message, so they run in parallel); once every
    call is answered it replies with the answers, summed when there are several products.
    """

    tool_names: tuple[str, ...] = ()

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self.model_copy(update={"tool_names": tuple(t.name for t in tools)})

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        answers = [m for m in messages if isinstance(m, ToolMessage)]
        reply = _answer(answers) if answers else _calls(_question(messages), self.tool_names)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _question(messages: list[BaseMessage]) -> str:
    return next(str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage))


def _calls(question: str, tools: tuple[str, ...]) -> AIMessage:
    """The tool calls a question asks for (none: a reply saying so)."""
    calls: list[dict[str, Any]] = []
    if "multiply" in tools:
        for i, (a, b) in enumerate(re.findall(r"(\d+) times (\d+)", question)):
            calls.append({"name": "multiply", "args": {"a": int(a), "b": int(b)}, "id": f"m{i}"})
    if "search" in tools and not calls:
        calls.append({"name": "search", "args": {"query": question}, "id": "s0"})
    if not calls:
        return AIMessage(content="I have no tool for that question.")
    return AIMessage(content="", tool_calls=calls)


def _answer(answers: list[ToolMessage]) -> AIMessage:
    values = [str(m.content) for m in answers]
    if len(values) > 1 and all(v.lstrip("-").isdigit() for v in values):
        total = sum(int(v) for v in values)
        return AIMessage(content=f"{' + '.join(values)} = {total}")
    return AIMessage(content=" ".join(values))


math_agent = create_react_agent(ScriptedChatModel(), [add, multiply], name="math_agent")
research_agent = create_react_agent(ScriptedChatModel(), [search], name="research_agent")


def supervisor(state: MessagesState) -> Command[Any]:
    """Send the question to the specialist it needs; end once the specialist answered."""
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and not last.tool_calls:
        return Command(goto=END)
    question = _question(state["messages"])
    specialist = "math_agent" if re.search(r"\d+ times \d+", question) else "research_agent"
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
