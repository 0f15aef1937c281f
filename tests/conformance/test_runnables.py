"""LangChain Runnables as nodes: lambdas, sequences, and a prebuilt agent graph.

LangGraph accepts any ``Runnable`` as a node's action, names it by ``get_name()``, and calls
it with the state and the node's config; a graph made by ``langgraph.prebuilt`` is such a
Runnable. The scenarios run on every flavour (on the cluster the node runs on a worker).
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from .harness import Conform, attempt
from .impls import Impl

pytestmark = [
    pytest.mark.conformance,
    # create_react_agent is deprecated in LangGraph 1.x (for langchain's create_agent); the
    # scenario uses it because agent code in the wild does.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
]


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


def bump(state: State) -> dict[str, Any]:
    return {"log": ["bump"], "n": state["n"] + 1}


def runnable_nodes(impl: Impl) -> Any:
    def sees_config(state: State, config: Any) -> dict[str, Any]:
        return {"log": [f"thread {config['configurable'].get('thread_id')}"]}

    b = impl.StateGraph(State)
    b.add_node(RunnableLambda(bump))  # named "bump", by get_name()
    b.add_node(
        "chain", RunnableLambda(lambda s: s["n"]) | RunnableLambda(lambda n: {"log": [f"n={n}"]})
    )
    b.add_node("config", RunnableLambda(sees_config))
    b.add_edge(impl.START, "bump")
    b.add_edge("bump", "chain")
    b.add_edge("chain", "config")
    g = impl.compile(b, checkpointer=impl.saver())
    cfg = {"configurable": {"thread_id": "runnables"}}
    return {"invoke": g.invoke({"log": [], "n": 1}, cfg), "updates": list(g.stream({"n": 5}, cfg))}


def test_runnable_nodes(conform: Conform) -> None:
    conform(runnable_nodes)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class ToolCallingFake(GenericFakeChatModel):
    """A fake chat model that accepts tools (its answers are scripted)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _plain(messages: list[BaseMessage]) -> list[tuple[str, Any]]:
    return [(type(m).__name__, m.content) for m in messages]


def prebuilt_agent_as_node(impl: Impl) -> Any:
    script = [
        AIMessage(content="", tool_calls=[{"name": "add", "args": {"a": 2, "b": 3}, "id": "c1"}]),
        AIMessage(content="2 + 3 = 5"),
    ]
    agent = create_react_agent(ToolCallingFake(messages=iter(script)), [add])
    b = impl.StateGraph(impl.MessagesState)
    b.add_node("agent", agent)
    b.add_node("after", lambda s: {"messages": [("ai", f"{len(s['messages'])} messages")]})
    b.add_edge(impl.START, "agent")
    b.add_edge("agent", "after")
    out = impl.compile(b).invoke({"messages": [("user", "what is 2 + 3?")]})
    return _plain(out["messages"])


def test_prebuilt_agent_as_node(conform: Conform) -> None:
    conform(prebuilt_agent_as_node)


def _script() -> Any:
    return iter(
        [
            AIMessage(
                content="",
                tool_calls=[
                    {"name": "add", "args": {"a": 2, "b": 3}, "id": "c1"},
                    {"name": "add", "args": {"a": 10, "b": 1}, "id": "c2"},
                    {"name": "missing", "args": {}, "id": "c3"},
                ],
            ),
            AIMessage(content="the sums are 5 and 11"),
        ]
    )


def native_react_agent(impl: Impl) -> Any:
    """The flavour's own create_react_agent: each tool call is a task (on a cluster, on
    workers); the agent's messages match LangGraph's."""
    agent = impl.prebuilt.create_react_agent(
        ToolCallingFake(messages=_script()), [add], prompt="Answer briefly."
    )
    out = agent.invoke({"messages": [("user", "add things")]})
    return _plain(out["messages"])


def test_native_react_agent(conform: Conform) -> None:
    conform(native_react_agent)


def tool_node_with_tools_condition(impl: Impl) -> Any:
    """A hand-built loop: a model node, ToolNode and tools_condition, errors answered."""

    @tool
    def divide(a: int, b: int) -> float:
        """Divide a by b."""
        return a / b

    model = ToolCallingFake(
        messages=iter(
            [
                AIMessage("", tool_calls=[{"name": "divide", "args": {"a": 1, "b": 0}, "id": "d"}]),
                AIMessage("cannot divide by zero"),
            ]
        )
    )
    b = impl.StateGraph(impl.MessagesState)
    b.add_node("model", lambda s: {"messages": [model.invoke(s["messages"])]})
    b.add_node("tools", impl.prebuilt.ToolNode([divide], handle_tool_errors=True))
    b.add_edge(impl.START, "model")
    b.add_conditional_edges("model", impl.prebuilt.tools_condition)
    b.add_edge("tools", "model")
    out = impl.compile(b).invoke({"messages": [("user", "1/0?")]})
    return [(type(m).__name__, m.content, getattr(m, "status", None)) for m in out["messages"]]


def test_tool_node_with_tools_condition(conform: Conform) -> None:
    conform(tool_node_with_tools_condition)


def model_calls_keep_their_own_ids(impl: Impl) -> Any:
    """A node handing its config to a chat model twice, in a run given a ``run_id``: each
    answer keeps an id of its own (the run's id is not passed on to the model calls), so
    ``add_messages`` keeps both."""
    import uuid

    model = GenericFakeChatModel(messages=iter([AIMessage("first"), AIMessage("second")]))

    def twice(state: Any, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"], config) for _ in range(2)]}

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("twice", twice)
    b.add_edge(impl.START, "twice")
    out = impl.compile(b).invoke({"messages": [("user", "hi")]}, {"run_id": uuid.uuid4()})
    ids = [m.id for m in out["messages"]]
    return {"messages": _plain(out["messages"]), "distinct_ids": len(set(ids)) == len(ids)}


def test_model_calls_keep_their_own_ids(conform: Conform) -> None:
    conform(model_calls_keep_their_own_ids)


def a_graph_as_a_runnable(impl: Impl) -> Any:
    """A compiled graph where LangChain expects a Runnable: ``batch`` / ``abatch`` run each
    input (``return_exceptions`` keeps failures in place), ``with_config`` binds a config
    each run starts from."""

    class Count(TypedDict):
        n: int
        who: str

    def step(state: Count, config: RunnableConfig) -> dict[str, Any]:
        if state["n"] < 0:
            raise ValueError("negative")
        return {"n": state["n"] + 1, "who": config["configurable"].get("user", "-")}

    b = impl.StateGraph(Count)
    b.add_node("step", step)
    b.add_edge(impl.START, "step")
    g = impl.compile(b)
    bound = g.with_config(configurable={"user": "ada"})
    inputs = [{"n": 1, "who": ""}, {"n": -1, "who": ""}, {"n": 5, "who": ""}]
    per_input = [{"configurable": {"user": u}} for u in ("a", "b", "c")]
    return {
        "batch": [
            r if isinstance(r, dict) else type(r).__name__
            for r in g.batch(inputs, per_input, return_exceptions=True)
        ],
        "abatch": asyncio.run(g.abatch([inputs[0], inputs[2]])),
        "fails": type(attempt(g.batch, inputs)).__name__,
        "bound": bound.invoke({"n": 0, "who": ""}),
        "bound overridden": bound.invoke({"n": 0, "who": ""}, {"configurable": {"user": "bo"}}),
        "unbound": g.invoke({"n": 0, "who": ""}),
    }


def test_a_graph_as_a_runnable(conform: Conform) -> None:
    conform(a_graph_as_a_runnable)
