"""Hierarchical teams — a supervisor of supervisors: ``python examples/hierarchical.py``.

The top supervisor routes between two teams, and each team is itself a compiled graph added
as a node: a team supervisor routing between its own workers (``create_react_agent``
subgraphs, so the workers are subgraphs of subgraphs):

- ``research_team``: ``search_agent`` (``search``) and ``math_agent`` (``add``,
  ``multiply``);
- ``writing_team``: ``writer`` (``outline``: the findings as a list) and ``editor``
  (``count_words``: the report's length, for its headline).

A supervisor is a model with one ``transfer_to_<member>`` tool per member: the tool it calls
says who works next (the call itself is never run, and stays out of the conversation); a
reply without a call ends the team's turn (or, at the top, the run). Everyone shares the one
``messages`` list, so the writing team reads what the research team found::

    python examples/hierarchical.py "write a short report: what is pregel, and 6 times 7?"

On a cluster every model call and tool call of every level is a task a worker runs::

    PYTHONPATH=. bulksync worker --graph examples.hierarchical:graph
    PYTHONPATH=. bulksync coordinator --graph examples.hierarchical:graph
    bulksync submit examples.hierarchical:graph --wait \\
        --input '{"messages": [["user", "write a short report: what is pregel, and 6 times 7?"]]}'

The models are scripted (``examples/_models.py``; ``BULKSYNC_EXAMPLE_MODEL`` names a real one).
Needs the ``agents`` extra.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.tools import tool

if not __package__:  # run as a script: ``examples.*`` imports from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bulksync.graph import END, START, MessagesState, StateGraph
from bulksync.prebuilt import create_react_agent
from bulksync.types import Command
from examples._models import Script, calls, chat_model, question, results, say
from examples._tools import add, multiply, search

QUESTION = "write a short report: what is pregel, and 6 times 7?"
RESEARCH_TOOLS = ("search", "add", "multiply")


@tool
def outline(facts: list[str]) -> str:
    """Lay findings out as a bulleted list, one finding a line."""
    return "\n".join(f"- {fact}" for fact in facts)


@tool
def count_words(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


# -- supervisors -----------------------------------------------------------------------------


def supervisor_node(name: str, model: BaseChatModel, members: Sequence[str], prompt: str) -> Any:
    """A node routing to ``members``: it asks ``model`` (bound to one ``transfer_to_<member>``
    tool each) and goes where the model's call says, or to END when it calls none."""
    routes = {f"transfer_to_{m}": m for m in members}
    bound = model.bind_tools([_transfer_schema(tool_name, m) for tool_name, m in routes.items()])

    def supervise(state: MessagesState) -> Command[Any]:
        reply = bound.invoke([SystemMessage(prompt), *state["messages"]])
        chosen = [c["name"] for c in getattr(reply, "tool_calls", []) if c["name"] in routes]
        return Command(goto=routes[chosen[0]] if chosen else END)

    supervise.__name__ = name
    return supervise


def _transfer_schema(tool_name: str, member: str) -> dict[str, Any]:
    """A tool a supervisor's model can call to pick ``member`` (an OpenAI-style function)."""
    description = f"Hand the work to {member}."
    parameters = {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool_name, "description": description, "parameters": parameters},
    }


def top_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted top supervisor: research first, then writing, then done."""
    if not results(messages, "search"):
        return calls(("transfer_to_research_team", {}))
    if not results(messages, "count_words"):
        return calls(("transfer_to_writing_team", {}))
    return say("The report is ready.")


def research_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted research supervisor: look the topic up, then do the arithmetic asked."""
    if not results(messages, "search"):
        return calls(("transfer_to_search_agent", {}))
    if _products(question(messages)) and not results(messages, "multiply"):
        return calls(("transfer_to_math_agent", {}))
    return say("Research done.")


def writing_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted writing supervisor: the writer drafts, then the editor finishes."""
    if not results(messages, "outline"):
        return calls(("transfer_to_writer", {}))
    if not results(messages, "count_words"):
        return calls(("transfer_to_editor", {}))
    return say("Writing done.")


# -- workers -----------------------------------------------------------------------------------


def _products(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"(\d+) times (\d+)", text)]


def _product_facts(messages: Sequence[BaseMessage]) -> list[str]:
    """Each product asked, as "A times B is C" with the answer of its ``multiply`` call."""
    pairs = zip(_products(question(messages)), results(messages, "multiply"), strict=False)
    return [f"{a} times {b} is {answer.content}" for (a, b), answer in pairs]


def search_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted search agent: look up the question, report what was found."""
    found = results(messages, "search")
    if found:
        return say(str(found[-1].content))
    return calls(("search", {"query": question(messages)}))


def math_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted math agent: one ``multiply`` per "A times B", then the results."""
    if results(messages, "multiply"):
        return say("; ".join(_product_facts(messages)))
    return calls(*(("multiply", {"a": a, "b": b}) for a, b in _products(question(messages))))


def writer_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted writer: outline the research agents' findings, then hand in the outline."""
    drafted = results(messages, "outline")
    if drafted:
        return say(str(drafted[-1].content))
    facts = [str(m.content) for m in results(messages, "search")]
    facts += [f"{fact}." for fact in _product_facts(messages)]
    return calls(("outline", {"facts": facts}))


def editor_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted editor: count the draft's words, then give the report its headline."""
    draft = str(results(messages, "outline")[-1].content) if results(messages, "outline") else ""
    counted = results(messages, "count_words")
    if counted:
        return say(f"Report ({counted[-1].content} words):\n{draft}")
    return calls(("count_words", {"text": draft}))


# -- the graphs ------------------------------------------------------------------------------


def team(name: str, supervisor: Any, workers: dict[str, Any]) -> Any:
    """A team: its supervisor routes to one worker at a time; each worker reports back."""
    builder = StateGraph(MessagesState)
    builder.add_node("supervisor", supervisor, destinations=(*workers, END))
    for worker, agent in workers.items():
        builder.add_node(worker, agent)
        builder.add_edge(worker, "supervisor")
    builder.add_edge(START, "supervisor")
    return builder.compile(name=name)


def worker(name: str, script: Script, tools: list[Any], prompt: str) -> Any:
    """A worker: a ReAct agent (model ⇄ tools until it answers) named ``name``."""
    return create_react_agent(chat_model(script), tools, prompt=prompt, name=name)


SUPERVISOR_PROMPT = (
    "You are a supervisor of {members}. Given the conversation, call the transfer tool of the "
    "member who should act next; when their work is done, answer without calling a tool."
)


def build_graph() -> Any:
    """The top supervisor over the research team and the writing team."""
    research = team(
        "research_team",
        supervisor_node(
            "supervisor",
            chat_model(research_script),
            ("search_agent", "math_agent"),
            SUPERVISOR_PROMPT.format(members="search_agent (look-ups) and math_agent"),
        ),
        {
            "search_agent": worker(
                "search_agent", search_script, [search], "Look the topics asked about up."
            ),
            "math_agent": worker(
                "math_agent", math_script, [add, multiply], "Do the arithmetic asked, with tools."
            ),
        },
    )
    writing = team(
        "writing_team",
        supervisor_node(
            "supervisor",
            chat_model(writing_script),
            ("writer", "editor"),
            SUPERVISOR_PROMPT.format(members="writer (drafts) and editor (finishes)"),
        ),
        {
            "writer": worker(
                "writer", writer_script, [outline], "Outline the findings with the outline tool."
            ),
            "editor": worker(
                "editor",
                editor_script,
                [count_words],
                "Count the draft's words, then give it a headline with the count.",
            ),
        },
    )
    top = supervisor_node(
        "supervisor",
        chat_model(top_script),
        ("research_team", "writing_team"),
        SUPERVISOR_PROMPT.format(members="a research team and a writing team (research first)"),
    )
    builder = StateGraph(MessagesState)
    builder.add_node("supervisor", top, destinations=("research_team", "writing_team", END))
    builder.add_node("research_team", research)
    builder.add_node("writing_team", writing)
    builder.add_edge(START, "supervisor")
    builder.add_edge("research_team", "supervisor")
    builder.add_edge("writing_team", "supervisor")
    return builder.compile(name="hierarchical")


graph = build_graph()
"""The graph workers and coordinators load: ``--graph examples.hierarchical:graph``."""


def main(text: str = QUESTION) -> None:
    """Run the teams in-process on ``text``: print who worked when, then the report."""
    final: dict[str, Any] = {}
    chunks = graph.stream(
        {"messages": [("user", text)]}, stream_mode=["updates", "values"], subgraphs=True
    )
    for namespace, mode, chunk in chunks:
        if mode == "values" and not namespace:
            final = chunk
        elif mode == "updates" and len(namespace) < 2:  # the teams' steps, not the agents'
            path = [part.partition(":")[0] for part in namespace]
            for node in chunk:
                print("  " * len(path) + " > ".join([*path, node]))
    print(final["messages"][-1].content)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or QUESTION)
