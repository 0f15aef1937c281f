"""``create_react_agent``: a model that calls tools until it answers, as a bulksync graph.

The graph LangGraph's helper builds: an ``agent`` node calls the model on the messages (after
the prompt, if any); when its answer asks for tool calls, each call is sent to the ``tools``
node as a task of its own (LangGraph's "v2"; "v1" runs them in one task), and the answers go
back to the agent. A tool with ``return_direct`` ends the run with its answer. On a cluster
the model call and every tool call are tasks that workers run, so parallel tool calls run in
parallel on workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from bulksync.constants import END, START
from bulksync.errors import ConfigError
from bulksync.graph import StateGraph, add_messages
from bulksync.graph.compiled import CompiledStateGraph
from bulksync.prebuilt.tool_node import ToolNode, tool_call_sends
from bulksync.types import Send


class AgentState(TypedDict):
    """The state of a ReAct agent: its conversation."""

    messages: Annotated[Sequence[AnyMessage], add_messages]


Prompt = str | SystemMessage | Callable[[Any], Any] | Runnable[Any, Any] | None


def create_react_agent(
    model: BaseChatModel | Runnable[Any, Any] | Callable[[Any], Any],
    tools: Sequence[BaseTool | Callable[..., Any]] | ToolNode,
    *,
    prompt: Prompt = None,
    state_schema: type[Any] | None = None,
    checkpointer: Any = None,
    interrupt_before: list[str] | None = None,
    interrupt_after: list[str] | None = None,
    debug: bool = False,
    version: Literal["v1", "v2"] = "v2",
    name: str | None = None,
) -> CompiledStateGraph:
    """A compiled ReAct agent graph: ``agent`` ⇄ ``tools`` until the model stops calling.

    Raises:
        ConfigError: the model is given by name (bulksync does not pick model providers:
            pass a chat model), or ``version`` is neither "v1" nor "v2".
    """
    if isinstance(model, str):
        raise ConfigError(
            f"create_react_agent(model={model!r}): pass a chat model object (e.g. "
            "ChatOpenAI(...)); bulksync does not resolve models by name."
        )
    if version not in ("v1", "v2"):
        raise ConfigError(f"create_react_agent(version={version!r}): use 'v1' or 'v2'.")
    tool_node = tools if isinstance(tools, ToolNode) else ToolNode(tools)
    bound = _bind_tools(model, list(tool_node.tools_by_name.values()))
    direct = {n for n, t in tool_node.tools_by_name.items() if getattr(t, "return_direct", False)}

    def agent(state: Any, config: Any) -> dict[str, Any]:
        messages = _prompted(prompt, state)
        return {"messages": [bound.invoke(messages, config)]}

    def route(state: Any) -> str | list[Send]:
        last = _messages(state)[-1]
        if not isinstance(last, AIMessage) or not last.tool_calls:
            return END
        return "tools" if version == "v1" else tool_call_sends("tools", last, state)

    builder = StateGraph(state_schema or AgentState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    if direct:
        builder.add_conditional_edges("tools", _after_tools(direct), ["agent", END])
    else:
        builder.add_edge("tools", "agent")
    return builder.compile(
        checkpointer=checkpointer,
        interrupt_before=interrupt_before,
        interrupt_after=interrupt_after,
        debug=debug,
        name=name,
    )


def _bind_tools(model: Any, tools: list[BaseTool]) -> Any:
    """``model`` with the tools bound (a chat model that was not bound to them already)."""
    if tools and isinstance(model, BaseChatModel):
        return model.bind_tools(tools)
    return model


def _messages(state: Any) -> list[Any]:
    return list(state["messages"] if isinstance(state, dict) else state.messages)


def _prompted(prompt: Prompt, state: Any) -> Any:
    """What the model is called with: the state's messages behind the prompt."""
    if prompt is None:
        return _messages(state)
    if isinstance(prompt, str):
        return [SystemMessage(content=prompt), *_messages(state)]
    if isinstance(prompt, SystemMessage):
        return [prompt, *_messages(state)]
    if isinstance(prompt, Runnable):
        return prompt.invoke(state)
    return prompt(state)


def _after_tools(direct: set[str]) -> Callable[[Any], str]:
    """Route after the tools: END once a ``return_direct`` tool answered, else the agent."""

    def route(state: Any) -> str:
        for message in reversed(_messages(state)):
            if not isinstance(message, ToolMessage):
                break
            if message.name in direct:
                return END
        return "agent"

    return route
