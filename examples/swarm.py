"""A swarm of agents handing control to each other: ``python examples/swarm.py``.

A travel desk with two agents, each a ``create_react_agent`` subgraph: ``flight_agent``
(``search_flights``) and ``hotel_agent`` (``search_hotels``). Neither routes through a
supervisor: each also has a handoff tool (``transfer_to_hotel_agent``,
``transfer_to_flight_agent``) that answers with ``Command(goto=<agent>, graph=Command.PARENT)``
— the tool call ends the agent's subgraph and the swarm graph runs the other agent next, with
the conversation so far. The handoff also sets ``active_agent``, and a new message on the same
thread starts at that agent (``START`` routes on it), so a follow-up goes back to whoever was
helping. The demo is two turns on one thread: "a hotel in Paris" (the flight agent, the
default, hands off to the hotel agent), then "any under 150 EUR?" (straight to the hotel agent,
which knows the city from the conversation; the flight agent would have searched flights)::

    python examples/swarm.py                          # both turns, in-process
    python examples/swarm.py "I need a flight to Rome"  # one turn of your own

On a cluster (every model call and tool call is a task; a thread keeps the conversation and
``active_agent`` in Postgres, so the second turn may run on other workers and coordinators)::

    PYTHONPATH=. bulksync worker --graph examples.swarm:graph
    PYTHONPATH=. bulksync coordinator --graph examples.swarm:graph
    bulksync submit examples.swarm:graph --thread trip-1 --wait \\
        --input '{"messages": [["user", "I need a hotel in Paris for two nights"]]}'
    bulksync submit examples.swarm:graph --thread trip-1 --wait \\
        --input '{"messages": [["user", "any under 150 EUR a night?"]]}'

The models are scripted (``examples/_models.py``; ``BULKSYNC_EXAMPLE_MODEL`` names a real one).
Needs the ``agents`` extra. ``graph`` is compiled with an in-memory checkpointer so the
in-process demo has a thread; on a cluster the coordinator checkpoints to Postgres instead.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool

if not __package__:  # run as a script: ``examples.*`` imports from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bulksync.checkpoint.memory import InMemorySaver
from bulksync.graph import START, MessagesState, StateGraph
from bulksync.prebuilt import InjectedState, create_react_agent
from bulksync.types import Command
from examples._models import asked, calls, chat_model, question, results, say

AGENTS = ("flight_agent", "hotel_agent")
DEFAULT_AGENT = "flight_agent"
"""The agent a thread's first message goes to."""

FLIGHTS = {
    "paris": [("AF 1234", "07:05", 180), ("LH 2210", "13:40", 145)],
    "rome": [("AZ 0609", "09:15", 120), ("FR 4411", "18:30", 60)],
}
HOTELS = {
    "paris": [("Le Petit Quai", 95), ("Hotel Lumiere", 140), ("Grand Palais Suites", 420)],
    "rome": [("Casa Trastevere", 110), ("Albergo del Sole", 210)],
}


class SwarmState(MessagesState, total=False):
    """The conversation, and which agent answers the next message."""

    active_agent: str


@tool
def search_flights(city: str) -> str:
    """Find flights to a city."""
    found = FLIGHTS.get(city.lower(), [])
    listed = ", ".join(f"{code} at {time} ({price} EUR)" for code, time, price in found)
    return f"Flights to {city.title()}: {listed}." if found else f"No flights to {city}."


@tool
def search_hotels(city: str, max_price: int | None = None) -> str:
    """Find hotels in a city, at most ``max_price`` EUR a night if given."""
    found = [(n, p) for n, p in HOTELS.get(city.lower(), []) if max_price is None or p <= max_price]
    within = f" at most {max_price} EUR a night" if max_price is not None else ""
    listed = ", ".join(f"{name} ({price} EUR a night)" for name, price in found)
    return f"Hotels in {city.title()}{within}: {listed}." if found else f"No hotels in {city}."


def handoff_tool(agent: str, description: str) -> BaseTool:
    """A tool that hands the conversation to ``agent``: its answer is a ``Command`` to the
    swarm graph (``Command.PARENT``) to run ``agent`` next and make it the active one."""
    name = f"transfer_to_{agent}"

    @tool(name, description=description)
    def handoff(
        state: Annotated[dict[str, Any], InjectedState],
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> Command[Any]:
        done = ToolMessage(f"Transferred to {agent}.", name=name, tool_call_id=tool_call_id)
        # The parent graph sees only this update, not the agent's own state: it carries the
        # agent's messages (the tool call included) and the call's answer.
        update = {"messages": [*state["messages"], done], "active_agent": agent}
        return Command(goto=agent, graph=Command.PARENT, update=update)

    return handoff


def _city(messages: Sequence[BaseMessage]) -> str | None:
    """The latest city the user named (a follow-up need not name it again)."""
    for text in asked(messages):
        for city in sorted({*FLIGHTS, *HOTELS}):
            if city in text.lower():
                return city
    return None


def flight_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted flight agent: hands hotel questions over, searches flights otherwise."""
    found = results(messages, "search_flights")
    if found:
        return say(str(found[-1].content))
    if "hotel" in question(messages).lower():
        return calls(("transfer_to_hotel_agent", {}))
    return calls(("search_flights", {"city": _city(messages) or "nowhere"}))


def hotel_script(messages: Sequence[BaseMessage], tools: tuple[str, ...]) -> AIMessage:
    """The scripted hotel agent: hands flight questions over, searches hotels otherwise
    (within a price a follow-up names: "under 150 EUR")."""
    found = results(messages, "search_hotels")
    if found:
        return say(str(found[-1].content))
    text = question(messages).lower()
    if "flight" in text:
        return calls(("transfer_to_flight_agent", {}))
    args: dict[str, Any] = {"city": _city(messages) or "nowhere"}
    price = re.search(r"(?:under|below|at most|cheaper than) (\d+)", text)
    if price:
        args["max_price"] = int(price.group(1))
    return calls(("search_hotels", args))


PROMPT = (
    "You are the {role} of a travel desk team. Use your tools for {topic}. For anything else, "
    "transfer the user to the colleague whose tool fits; never answer for them."
)


def build_graph(checkpointer: Any = None) -> Any:
    """The swarm: START → the active agent; a handoff runs the other agent next."""
    flight_agent = create_react_agent(
        chat_model(flight_script),
        [search_flights, handoff_tool("hotel_agent", "Transfer the user to the hotel agent.")],
        prompt=PROMPT.format(role="flight agent", topic="flights"),
        name="flight_agent",
    )
    hotel_agent = create_react_agent(
        chat_model(hotel_script),
        [search_hotels, handoff_tool("flight_agent", "Transfer the user to the flight agent.")],
        prompt=PROMPT.format(role="hotel agent", topic="hotels"),
        name="hotel_agent",
    )
    builder = StateGraph(SwarmState)
    builder.add_node("flight_agent", flight_agent, destinations=("hotel_agent",))
    builder.add_node("hotel_agent", hotel_agent, destinations=("flight_agent",))
    builder.add_conditional_edges(START, active_agent, list(AGENTS))
    return builder.compile(checkpointer=checkpointer, name="swarm")


def active_agent(state: SwarmState) -> str:
    """Where a new message goes: the agent that was active last on this thread."""
    return state.get("active_agent") or DEFAULT_AGENT


graph = build_graph(InMemorySaver())
"""The graph workers and coordinators load: ``--graph examples.swarm:graph``."""

TURNS = ("I need a hotel in Paris for two nights", "any under 150 EUR a night?")


def main(turns: Sequence[str] = TURNS, thread_id: str = "trip-1") -> None:
    """Send each of ``turns`` on one thread in-process; print who answered what."""
    config = {"configurable": {"thread_id": thread_id}}
    for text in turns:
        start = active_agent(graph.get_state(config).values)
        out = graph.invoke({"messages": [("user", text)]}, config)
        print(f"user: {text}\n  (to {start}, answered by {out.get('active_agent', start)})")
        print(f"  {out['messages'][-1].content}")


if __name__ == "__main__":
    main([" ".join(sys.argv[1:])] if sys.argv[1:] else TURNS)
