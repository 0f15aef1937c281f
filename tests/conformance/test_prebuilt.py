"""The flavour's own prebuilt parts (``impl.prebuilt``): ``ToolNode`` and ``create_react_agent``.

LangGraph's ``ToolNode`` invokes each tool with the model's whole tool call, so a tool may
declare an ``InjectedToolCallId`` argument, and answer with a ``ToolMessage`` or a ``Command``
of its own (a swarm's handoff tools are written so), checked to answer its call.
``create_react_agent(name=...)`` names each answer of its model after the agent; its state's
``remaining_steps`` makes it stop gracefully near the recursion limit. The graphs run where the
flavour runs graphs (on a cluster every model call and tool call is a task of its own).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool

from .harness import Conform, attempt, collect
from .impls import Impl

pytestmark = [
    pytest.mark.conformance,
    # create_react_agent is deprecated in LangGraph 1.x (for langchain's create_agent); the
    # scenarios use it because agent code in the wild does.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
]


class ToolCallingFake(GenericFakeChatModel):
    """A fake chat model that accepts tools (its answers are scripted)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def model(*answers: AIMessage) -> ToolCallingFake:
    return ToolCallingFake(messages=iter(answers))


def asks(*calls: tuple[str, dict[str, Any], str]) -> AIMessage:
    """An AI message asking for ``calls`` (name, arguments, call id)."""
    return AIMessage("", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls])


def seen(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """What a model reads back of each message (and what a program may inspect)."""
    out = []
    for m in messages:
        shown: dict[str, Any] = {"type": m.type, "content": m.content, "name": m.name}
        if isinstance(m, ToolMessage):
            shown.update(call=m.tool_call_id, status=m.status, artifact=m.artifact)
        out.append(shown)
    return out


def run_here(impl: Impl, graph: Any) -> Any:
    """A graph built by ``impl.prebuilt``, run the way the flavour runs graphs."""
    return impl.attach(graph) if impl.attach is not None else graph


def annotated(func: Any, **hints: Any) -> Any:
    """``func`` with ``hints`` as its annotations: the injection markers are the flavour's
    own, which a module's (string) annotations cannot name."""
    func.__annotations__ = {**hints, "return": Any}
    return func


class Chat(TypedDict):
    messages: Annotated[list[Any], operator.add]


def tool_loop(
    impl: Impl, tools: list[Any], calls: list[AIMessage], state: type[Any] = Chat, **kw: Any
) -> Any:
    """A graph asking for ``calls`` one after the other (one AI message a step), each
    answered by ``impl.prebuilt.ToolNode(tools, **kw)``; ``store`` goes to compile."""
    script = iter(calls)

    def caller(state: Any) -> dict[str, Any]:
        return {"messages": [next(script, AIMessage("done"))]}

    store = kw.pop("store", None)
    b = impl.StateGraph(state)
    b.add_node("caller", caller)
    b.add_node("tools", impl.prebuilt.ToolNode(tools, **kw))
    b.add_edge(impl.START, "caller")
    b.add_conditional_edges("caller", impl.prebuilt.tools_condition)
    b.add_edge("tools", "caller")
    return impl.compile(b, store=store) if store is not None else impl.compile(b)


# -- tools given the whole tool call --------------------------------------------------------


@tool
def file_item(item: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
    """File an item under the call that asked for it."""
    return f"{item} filed under {tool_call_id}"


@tool
def report(item: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
    """Report on an item with a message of the tool's own."""
    return ToolMessage(["report on", item], tool_call_id=tool_call_id, artifact={"item": item})


def tools_given_their_call_id(impl: Impl) -> Any:
    """A tool declaring ``InjectedToolCallId`` gets the id of the call it answers (never the
    model's own value for it, which the schema hides), and may answer with a ToolMessage
    of its own (its content made text as LangGraph makes it)."""
    calls = [
        asks(("file_item", {"item": "invoice"}, "call-1"), ("report", {"item": "q3"}, "call-2")),
        asks(("file_item", {"item": "memo", "tool_call_id": "forged"}, "call-3")),
    ]
    out = tool_loop(impl, [file_item, report], calls).invoke({"messages": []})
    return {
        "messages": seen(out["messages"]),
        "schema": sorted(file_item.tool_call_schema.model_json_schema()["properties"]),
    }


def test_tools_given_their_call_id(conform: Conform) -> None:
    conform(tools_given_their_call_id)


@tool
def listing() -> list[str]:
    """Strings."""
    return ["a", "b"]


@tool
def blocks() -> list[dict[str, Any]]:
    """Content blocks."""
    return [{"type": "text", "text": "block"}]


@tool
def odd_blocks() -> list[dict[str, Any]]:
    """Dicts that are no content blocks LangChain knows."""
    return [{"type": "custom", "value": 1}]


@tool
def record() -> dict[str, Any]:
    """A record."""
    return {"ok": True, "n": 1}


@tool
def number() -> int:
    """A number."""
    return 7


def tool_answers_as_message_content(impl: Impl) -> Any:
    """Each kind of answer becomes the ToolMessage's content as LangGraph makes it: text
    and content blocks as they are, anything else (a list of strings too) as JSON."""
    names = ["listing", "blocks", "odd_blocks", "record", "number"]
    calls = [asks(*[(n, {}, f"c-{n}") for n in names])]
    tools = [listing, blocks, odd_blocks, record, number]
    out = tool_loop(impl, tools, calls).invoke({"messages": []})
    return seen(out["messages"])


def test_tool_answers_as_message_content(conform: Conform) -> None:
    conform(tool_answers_as_message_content)


# -- tools answering with a Command ---------------------------------------------------------


class Desk(TypedDict, total=False):
    messages: Annotated[list[Any], operator.add]
    handled_by: str
    log: Annotated[list[str], operator.add]


def tools_answering_with_commands(impl: Impl) -> Any:
    """A tool's ``Command`` updates the state and routes the graph; the ToolMessage answering
    its call is named after the tool. A Command that answers no call fails the node (or,
    with ``handle_tool_errors``, is answered with the error); so does a list of messages
    as the update of a graph whose state is a dict."""

    @tool
    def assign(team: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        """Assign the request to a team."""
        done = ToolMessage(f"assigned to {team}", tool_call_id=tool_call_id, name="renamed")
        return impl.Command(
            update={"messages": [done], "handled_by": team}, goto="audit", graph=None
        )

    @tool
    def silent(team: str) -> Any:
        """Change the team without answering the call."""
        return impl.Command(update={"handled_by": team})

    @tool
    def as_list(tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        """Answer with a list update."""
        return impl.Command(update=[ToolMessage("listed", tool_call_id=tool_call_id)])

    def build(tools: list[Any], calls: list[AIMessage], **kw: Any) -> Any:
        script = iter(calls)
        b = impl.StateGraph(Desk)
        b.add_node("caller", lambda s: {"messages": [next(script, AIMessage("done"))]})
        b.add_node("tools", impl.prebuilt.ToolNode(tools, **kw))
        b.add_node("audit", lambda s: {"log": [f"audit {s.get('handled_by')}"]})
        b.add_edge(impl.START, "caller")
        b.add_conditional_edges("caller", impl.prebuilt.tools_condition)
        b.add_edge("tools", "caller")
        return impl.compile(b)

    assigning = [asks(("assign", {"team": "billing"}, "a1"))]
    chunks = build([assign], assigning).stream({"messages": [], "log": []})
    tools_chunks = [c for c in chunks if "tools" in c]  # (audit and caller run side by side)
    final = build([assign], assigning).invoke({"messages": [], "log": []})
    silent_call = [asks(("silent", {"team": "x"}, "s1"))]
    raised = attempt(build([silent], silent_call).invoke, {"messages": []})
    answered = build([silent], silent_call, handle_tool_errors=True).invoke({"messages": []})
    listed = attempt(build([as_list], [asks(("as_list", {}, "l1"))]).invoke, {"messages": []})
    return {
        "update": [{**c["tools"], "messages": seen(c["tools"]["messages"])} for c in tools_chunks],
        "final": {**final, "messages": seen(final["messages"])},
        "unanswered": [raised, "MUST have a corresponding ToolMessage" in str(raised)],
        "unanswered, handled": seen(answered["messages"]),
        "list update": [listed, "only when using list of messages" in str(listed)],
    }


def test_tools_answering_with_commands(conform: Conform) -> None:
    conform(tools_answering_with_commands)


def handoff(impl: Impl, agent: str) -> BaseTool:
    """A swarm's handoff tool, as LangGraph users write it: it answers its own call and
    sends the conversation to ``agent`` in the parent graph."""
    name = f"transfer_to_{agent}"

    def transfer(state: dict[str, Any], tool_call_id: str) -> Any:
        done = ToolMessage(f"Transferred to {agent}", name=name, tool_call_id=tool_call_id)
        update = {"messages": [*state["messages"], done], "active": agent}
        return impl.Command(goto=agent, graph=impl.Command.PARENT, update=update)

    hinted = annotated(
        transfer,
        state=Annotated[dict[str, Any], impl.prebuilt.InjectedState],
        tool_call_id=Annotated[str, InjectedToolCallId],
    )
    return tool(name, description=f"Hand the user over to {agent}.")(hinted)


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def swarm_handoff_with_the_call_id(impl: Impl) -> Any:
    """Two prebuilt agents in a swarm: the first hands over with a tool that knows its call
    id (``InjectedToolCallId``) and answers with ``Command(graph=Command.PARENT)``; the
    second answers with a tool of its own."""
    first = impl.prebuilt.create_react_agent(
        model(asks(("transfer_to_helper", {}, "h1"))), [handoff(impl, "helper")], name="triage"
    )
    second = impl.prebuilt.create_react_agent(
        model(asks(("weather", {"city": "Oslo"}, "w1")), AIMessage("It is sunny in Oslo.")),
        [weather, handoff(impl, "triage")],
        name="helper",
    )

    class Swarm(impl.MessagesState, total=False):  # type: ignore[name-defined,misc]
        active: str

    b = impl.StateGraph(Swarm)
    b.add_node("triage", first, destinations=("helper",))
    b.add_node("helper", second, destinations=("triage",))
    b.add_edge(impl.START, "triage")
    out = impl.compile(b).invoke({"messages": [("user", "weather in Oslo?")]})
    return {"messages": seen(out["messages"]), "active": out.get("active")}


def test_swarm_handoff_with_the_call_id(conform: Conform) -> None:
    conform(swarm_handoff_with_the_call_id)


# -- injected state and store ---------------------------------------------------------------


class Notes(TypedDict):
    messages: Annotated[list[Any], operator.add]
    user: str


def injected_state_and_store(impl: Impl) -> Any:
    """``InjectedState`` fills an argument with the state (or one key of it) and
    ``InjectedStore`` with the graph's store; without a store the call fails, as on
    LangGraph."""

    def keep(text: str, user: str, state: dict[str, Any], store: Any) -> str:
        """Keep a note for the user."""
        store.put(("notes", user), text, {"text": text})
        kept = sorted(i.key for i in store.search(("notes", user)))
        return f"{user} has {kept} ({len(state['messages'])} messages so far)"

    note = tool("note")(
        annotated(
            keep,
            text=str,
            user=Annotated[str, impl.prebuilt.InjectedState("user")],
            state=Annotated[dict[str, Any], impl.prebuilt.InjectedState],
            store=Annotated[Any, impl.prebuilt.InjectedStore()],
        )
    )

    calls = [asks(("note", {"text": "milk"}, "n1")), asks(("note", {"text": "eggs"}, "n2"))]
    store = impl.store.InMemoryStore()
    out = tool_loop(impl, [note], calls, state=Notes, store=store).invoke(
        {"messages": [], "user": "ada"}
    )
    unstored = tool_loop(impl, [note], calls[:1], state=Notes)
    failed = attempt(unstored.invoke, {"messages": [], "user": "ada"})
    return {
        "messages": seen(out["messages"]),
        "kept": [i.value for i in store.search(("notes", "ada"))],
        "schema": sorted(note.tool_call_schema.model_json_schema()["properties"]),
        "without a store": [failed, str(failed)],
    }


def test_injected_state_and_store(conform: Conform) -> None:
    conform(injected_state_and_store)


# -- errors ---------------------------------------------------------------------------------


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@tool
def parse(text: str) -> int:
    """Parse a whole number."""
    return int(text)


def error_handler_catches_what_it_names(impl: Impl) -> Any:
    """A ``handle_tool_errors`` function answers the errors its parameter's annotation names
    (all of them, unannotated); any other error fails the node."""

    def only_value_errors(e: ValueError) -> str:
        return f"bad value: {e}"

    def either(e: Exception) -> str:
        return f"either: {type(e).__name__}"

    either.__annotations__ = {"e": ValueError | ZeroDivisionError, "return": str}  # not a string

    def anything(e):  # type: ignore[no-untyped-def]
        return f"anything: {type(e).__name__}"

    calls = [asks(("parse", {"text": "x"}, "p1")), asks(("divide", {"a": 1, "b": 0}, "d1"))]
    results = {}
    for handler in (only_value_errors, either, anything):
        graph = tool_loop(impl, [parse, divide], calls, handle_tool_errors=handler)
        out = attempt(graph.invoke, {"messages": []})
        results[handler.__name__] = out if isinstance(out, Exception) else seen(out["messages"])
    return results


def test_error_handler_catches_what_it_names(conform: Conform) -> None:
    conform(error_handler_catches_what_it_names)


# -- the tools stream -----------------------------------------------------------------------


def tool_node_streams_its_calls(impl: Impl) -> Any:
    """The ``tools`` stream mode shows each call of the flavour's own ToolNode, keyed by the
    model's call id, its answer the ToolMessage."""
    calls = [asks(("file_item", {"item": "memo"}, "t1"), ("divide", {"a": 1, "b": 0}, "t2"))]
    graph = tool_loop(impl, [file_item, divide], calls, handle_tool_errors=True)
    out = []
    for chunk in collect(graph.stream({"messages": []}, stream_mode="tools")):
        if isinstance(chunk, dict) and isinstance(chunk.get("output"), ToolMessage):
            chunk = {**chunk, "output": seen([chunk["output"]])}
        out.append(chunk)
    return sorted(out, key=repr)


def test_tool_node_streams_its_calls(conform: Conform) -> None:
    conform(tool_node_streams_its_calls)


# -- create_react_agent ---------------------------------------------------------------------


def react_agent_names_its_answers(impl: Impl) -> Any:
    """``create_react_agent(name=...)`` names every answer of its model after the agent; an
    agent without a name clears a name the model gave its answer."""
    named = impl.prebuilt.create_react_agent(
        model(asks(("weather", {"city": "Rome"}, "w1")), AIMessage("sunny")),
        [weather],
        name="forecaster",
    )
    unnamed = impl.prebuilt.create_react_agent(
        model(AIMessage("hello", name="model-given")), [weather]
    )
    question = {"messages": [("user", "weather?")]}
    return {
        "named": seen(run_here(impl, named).invoke(question)["messages"]),
        "unnamed": seen(run_here(impl, unnamed).invoke(question)["messages"]),
    }


def test_react_agent_names_its_answers(conform: Conform) -> None:
    conform(react_agent_names_its_answers)


def react_agent_as_a_named_subgraph(impl: Impl) -> Any:
    """A named agent added as a node of another graph, streamed with its subgraphs: each
    of its answers carries its name (what a supervisor reading the conversation sees)."""
    agent = impl.prebuilt.create_react_agent(
        model(asks(("weather", {"city": "Rome"}, "w1")), AIMessage("sunny")),
        [weather],
        name="forecaster",
    )
    b = impl.StateGraph(impl.MessagesState)
    b.add_node(agent)  # named by the graph's name
    b.add_edge(impl.START, "forecaster")
    chunks = impl.compile(b).stream({"messages": [("user", "weather?")]}, subgraphs=True)
    out = []
    for ns, update in chunks:
        for node, value in update.items():
            names = [m.name for m in (value or {}).get("messages", [])]
            out.append((len(ns), node, names))
    return out


def test_react_agent_as_a_named_subgraph(conform: Conform) -> None:
    conform(react_agent_as_a_named_subgraph)


def react_agent_out_of_steps(impl: Impl) -> Any:
    """An agent whose model keeps calling tools answers "need more steps" when the run's
    recursion limit is near, instead of failing (``remaining_steps`` in its state)."""
    calls = [asks(("weather", {"city": f"c{i}"}, f"w{i}")) for i in range(10)]
    agent = impl.prebuilt.create_react_agent(model(*calls), [weather], name="looper")
    out = run_here(impl, agent).invoke({"messages": [("user", "go")]}, {"recursion_limit": 6})
    return seen(out["messages"])


def test_react_agent_out_of_steps(conform: Conform) -> None:
    conform(react_agent_out_of_steps)


@tool(return_direct=True)
def lookup(key: str) -> str:
    """Look a key up (its answer ends the run)."""
    return f"value of {key}"


def react_agent_return_direct_among_parallel_calls(impl: Impl) -> Any:
    """A ``return_direct`` tool called next to another tool ends the run once both answered
    (each call is a task of its own, each routed on its own answer)."""
    agent = impl.prebuilt.create_react_agent(
        model(
            asks(("weather", {"city": "Rome"}, "w1"), ("lookup", {"key": "k"}, "l1")),
            AIMessage("should not be asked"),
        ),
        [weather, lookup],
    )
    out = run_here(impl, agent).invoke({"messages": [("user", "both")]})
    return seen(out["messages"])


def test_react_agent_return_direct_among_parallel_calls(conform: Conform) -> None:
    conform(react_agent_return_direct_among_parallel_calls)


def react_agent_with_a_store(impl: Impl) -> Any:
    """``create_react_agent(store=...)``: its tools' ``InjectedStore`` argument is that
    store."""

    def count(user: str, store: Any) -> str:
        """Count a visit of the user."""
        seen_before = store.get(("visits",), user)
        n = (seen_before.value["n"] if seen_before else 0) + 1
        store.put(("visits",), user, {"n": n})
        return f"{user}: visit {n}"

    visit = tool("visit")(
        annotated(count, user=str, store=Annotated[Any, impl.prebuilt.InjectedStore()])
    )
    store = impl.store.InMemoryStore()
    agent = impl.prebuilt.create_react_agent(
        model(
            asks(("visit", {"user": "ada"}, "v1"), ("visit", {"user": "bob"}, "v2")),
            asks(("visit", {"user": "ada"}, "v3")),
            AIMessage("counted"),
        ),
        [visit],
        store=store,
    )
    out = run_here(impl, agent).invoke({"messages": [("user", "count")]})
    return {"messages": seen(out["messages"]), "store": store.get(("visits",), "ada").value}


def test_react_agent_with_a_store(conform: Conform) -> None:
    conform(react_agent_with_a_store)


def react_agent_checks_the_conversation(impl: Impl) -> Any:
    """An agent given a conversation whose tool calls were never answered fails before
    calling its model, as LangGraph's does."""
    agent = impl.prebuilt.create_react_agent(model(AIMessage("unreached")), [weather])
    broken = {"messages": [("user", "hi"), asks(("weather", {"city": "Rome"}, "w1"))]}
    failed = attempt(run_here(impl, agent).invoke, broken)
    return [failed, str(failed).split("\n")[0]]


def test_react_agent_checks_the_conversation(conform: Conform) -> None:
    conform(react_agent_checks_the_conversation)


def react_agent_without_tools(impl: Impl) -> Any:
    """An agent given no tools is its model alone: a tool call it asks for ends the run
    unanswered (there is no ``tools`` node)."""
    agent = impl.prebuilt.create_react_agent(
        model(asks(("weather", {"city": "Rome"}, "w1"))), [], name="plain"
    )
    out = run_here(impl, agent).invoke({"messages": [("user", "hi")]})
    return {"messages": seen(out["messages"]), "nodes": sorted(agent.get_graph().nodes)}


def test_react_agent_without_tools(conform: Conform) -> None:
    conform(react_agent_without_tools)


class Bare(TypedDict):
    messages: Annotated[list[Any], operator.add]


def react_agent_state_schema_needs_its_keys(impl: Impl) -> Any:
    """A ``state_schema`` of one's own must declare ``messages`` and ``remaining_steps``."""

    failed = attempt(impl.prebuilt.create_react_agent, model(), [weather], state_schema=Bare)
    return [failed, str(failed)]


def test_react_agent_state_schema_needs_its_keys(conform: Conform) -> None:
    conform(react_agent_state_schema_needs_its_keys)
