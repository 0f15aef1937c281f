"""Collaborating agents on one shared conversation: ``python examples/collaborative.py``.

Two agents take turns on the same ``messages`` list, with no supervisor: a ``researcher``
(``lookup_population``, a tiny offline almanac) and a ``chart_writer`` (``bar_chart``, a text
chart). After each agent speaks a router decides: a tool call goes to ``call_tool`` (one
``ToolNode`` for everyone's tools), which hands the answer back to the agent that asked
(``sender``); a message containing "FINAL ANSWER" ends the run; any other message passes the
turn to the other agent, who reads everything said so far::

    python examples/collaborative.py "chart the populations of Berlin, Madrid and Paris"

On a cluster every model call and tool call is a task; the researcher's look-ups are calls
of one message, which one ``call_tool`` task runs at once::

    PYTHONPATH=. bulksync worker --graph examples.collaborative:graph
    PYTHONPATH=. bulksync coordinator --graph examples.collaborative:graph
    bulksync submit examples.collaborative:graph --wait \\
        --input '{"messages": [["user", "chart the populations of Berlin, Madrid and Paris"]]}'

The models are scripted (``examples/_models.py``; ``BULKSYNC_EXAMPLE_MODEL`` names a real one,
which the prompts tell to say "FINAL ANSWER"). Needs the ``agents`` extra.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.tools import BaseTool, tool

if not __package__:  # run as a script: ``examples.*`` imports from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bulksync.graph import END, START, MessagesState, StateGraph
from bulksync.prebuilt import ToolNode
from examples._models import calls, chat_model, question, results, say

QUESTION = "chart the populations of Berlin, Madrid and Paris"
FINAL = "FINAL ANSWER"
"""What a message starts with when the team is done: the router ends the run on it."""

POPULATIONS = {"berlin": 3.8, "madrid": 3.4, "rome": 2.8, "paris": 2.1, "vienna": 2.0}
"""Millions of inhabitants of the city proper, rounded (the offline almanac)."""


class TeamState(MessagesState, total=False):
    """The shared conversation, and the agent that spoke last (for tool answers)."""

    sender: str


@tool
def lookup_population(city: str) -> str:
    """Look up a city's population in the almanac."""
    found = POPULATIONS.get(city.lower())
    return f"{city.title()}: {found} million" if found else f"{city}: not in the almanac"


@tool
def bar_chart(values: dict[str, float], unit: str = "") -> str:
    """Draw a text bar chart of ``values`` (label → number), largest first."""
    if not values:
        return "(nothing to chart)"
    width, top = max(len(label) for label in values), max(values.values()) or 1
    rows = sorted(values.items(), key=lambda item: -item[1])
    return "\n".join(
        f"{label.ljust(width)} | {'#' * round(20 * value / top)} {value:g} {unit}".rstrip()
        for label, value in rows
    )


# -- the scripted agents --------------------------------------------------------------------


def researcher_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """Look up every city the question names at once, then report the figures."""
    found = results(messages, "lookup_population")
    if found:
        figures = ", ".join(str(m.content).replace(" million", "") for m in found)
        return say(f"Populations in millions: {figures}. Chart writer, over to you.")
    text = question(messages).lower()
    named = sorted((city for city in POPULATIONS if city in text), key=text.find)
    if not named:
        return say(f"{FINAL}: the almanac knows {', '.join(POPULATIONS)}; ask about those.")
    return calls(*(("lookup_population", {"city": city.title()}) for city in named))


def chart_writer_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """Chart the figures the researcher reported, then hand in the chart as the answer."""
    charted = results(messages, "bar_chart")
    if charted:
        return say(f"{FINAL}\n{charted[-1].content}")
    figures = {
        city: float(value)
        for m in results(messages, "lookup_population")
        for city, value in re.findall(r"(\w+): ([\d.]+) million", str(m.content))
    }
    if not figures:
        return say("Researcher, I need the figures first.")
    return calls(("bar_chart", {"values": figures, "unit": "million"}))


# -- the graph ---------------------------------------------------------------------------------

PROMPT = (
    "You are the {name} of a team of assistants answering the user together. Use your tools "
    "({tools}) to make progress; another assistant with other tools continues where you stop. "
    f"When you or a colleague have the complete answer, start your message with {FINAL}."
)


def agent_node(name: str, model: BaseChatModel, tools: Sequence[BaseTool]) -> Any:
    """A node: ``model`` (bound to ``tools``) replies to the whole conversation as ``name``."""
    bound = model.bind_tools(tools)
    prompt = PROMPT.format(name=name, tools=", ".join(t.name for t in tools))

    def act(state: TeamState) -> dict[str, Any]:
        reply = bound.invoke([SystemMessage(prompt), *state["messages"]])
        return {"messages": [reply.model_copy(update={"name": name})], "sender": name}

    act.__name__ = name
    return act


def router(state: TeamState) -> str:
    """After an agent: its tool calls, the end on a final answer, else the other's turn."""
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and last.tool_calls:
        return "call_tool"
    if FINAL in str(last.content):
        return END
    return "continue"


def build_graph() -> Any:
    """researcher ⇄ chart_writer, with their tool calls through ``call_tool``."""
    builder = StateGraph(TeamState)
    builder.add_node(
        "researcher", agent_node("researcher", chat_model(researcher_script), [lookup_population])
    )
    builder.add_node(
        "chart_writer", agent_node("chart_writer", chat_model(chart_writer_script), [bar_chart])
    )
    builder.add_node("call_tool", ToolNode([lookup_population, bar_chart]))
    builder.add_edge(START, "researcher")
    for agent, other in (("researcher", "chart_writer"), ("chart_writer", "researcher")):
        routes: dict[Hashable, str] = {"continue": other, "call_tool": "call_tool", END: END}
        builder.add_conditional_edges(agent, router, routes)
    builder.add_conditional_edges("call_tool", sender, ["researcher", "chart_writer"])
    return builder.compile(name="collaborative")


def sender(state: TeamState) -> str:
    """Tool answers go back to the agent that called the tools."""
    return state["sender"]


graph = build_graph()
"""The graph workers and coordinators load: ``--graph examples.collaborative:graph``."""


def main(text: str = QUESTION) -> None:
    """Run the team in-process on ``text``; print the conversation as it grows."""
    for update in graph.stream({"messages": [("user", text)]}, stream_mode="updates"):
        for node, writes in update.items():
            for message in (writes or {}).get("messages", []):
                listed = [f"{c['name']}({c['args']})" for c in getattr(message, "tool_calls", [])]
                print(f"{node}: {message.content or ', '.join(listed)}")


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or QUESTION)
