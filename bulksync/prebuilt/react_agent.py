"""``create_react_agent``: a model that calls tools until it answers, as a bulksync graph.

The graph LangGraph's helper builds: an ``agent`` node calls the model on the messages (after
the prompt, if any); when its answer asks for tool calls, each call is sent to the ``tools``
node as a task of its own (LangGraph's "v2"; "v1" runs them in one task), and the answers go
back to the agent. A tool with ``return_direct`` ends the run with its answer. As in
LangGraph, each answer of the model is named after the agent (``name``), and an agent near its
run's recursion limit (``remaining_steps``) answers that it needs more steps instead of
failing. On a cluster the model call and every tool call are tasks that workers run, so
parallel tool calls run in parallel on workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict, get_type_hints

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from bulksync.constants import END, START
from bulksync.errors import ConfigError
from bulksync.graph import StateGraph, add_messages
from bulksync.graph.compiled import CompiledStateGraph
from bulksync.managed import RemainingSteps
from bulksync.prebuilt.tool_node import ToolNode, tool_call_sends
from bulksync.types import Send


class AgentState(TypedDict):
    """The state of a ReAct agent: its conversation (and the steps its run has left)."""

    messages: Annotated[Sequence[AnyMessage], add_messages]
    remaining_steps: NotRequired[RemainingSteps]


NEED_MORE_STEPS = "Sorry, need more steps to process this request."
"""The agent's answer when its run's recursion limit would stop the next tool calls."""


Prompt = str | SystemMessage | Callable[[Any], Any] | Runnable[Any, Any] | None


def create_react_agent(
    model: BaseChatModel | Runnable[Any, Any] | Callable[[Any], Any],
    tools: Sequence[BaseTool | Callable[..., Any]] | ToolNode,
    *,
    prompt: Prompt = None,
    state_schema: type[Any] | None = None,
    context_schema: type[Any] | None = None,
    checkpointer: Any = None,
    store: Any = None,
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
        ValueError: ``state_schema`` lacks ``messages`` or ``remaining_steps``.
    """
    if isinstance(model, str):
        raise ConfigError(
            f"create_react_agent(model={model!r}): pass a chat model object (e.g. "
            "ChatOpenAI(...)); bulksync does not resolve models by name."
        )
    if version not in ("v1", "v2"):
        raise ConfigError(f"create_react_agent(version={version!r}): use 'v1' or 'v2'.")
    if state_schema is not None:
        missing = {"messages", "remaining_steps"} - set(get_type_hints(state_schema))
        if missing:
            raise ValueError(f"Missing required key(s) {missing} in state_schema")
    tool_node = tools if isinstance(tools, ToolNode) else ToolNode(tools)
    bound = _bind_tools(model, list(tool_node.tools_by_name.values()))
    direct = {n for n, t in tool_node.tools_by_name.items() if getattr(t, "return_direct", False)}

    def agent(state: Any, config: Any) -> dict[str, Any]:
        _check_conversation(_messages(state))
        response = bound.invoke(_prompted(prompt, state), config)
        response.name = name  # as LangGraph: the agent's name, or none
        if _out_of_steps(state, response, direct):
            return {"messages": [AIMessage(id=response.id, content=NEED_MORE_STEPS)]}
        return {"messages": [response]}

    def route(state: Any) -> str | list[Send]:
        last = _messages(state)[-1]
        if not isinstance(last, AIMessage) or not last.tool_calls:
            return END
        return "tools" if version == "v1" else tool_call_sends("tools", last, state)

    builder = StateGraph(state_schema or AgentState, context_schema)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    if tool_node.tools_by_name:
        builder.add_node("tools", tool_node)
        builder.add_conditional_edges("agent", route, ["tools", END])
        if direct:
            builder.add_conditional_edges("tools", _after_tools(direct), ["agent", END])
        else:
            builder.add_edge("tools", "agent")
    return builder.compile(
        checkpointer=checkpointer,
        store=store,
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


def _check_conversation(messages: list[Any]) -> None:
    """Raise LangGraph's ValueError when a tool call in ``messages`` has no answer (most
    model providers reject such a conversation)."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    open_calls = [
        call
        for m in messages
        if isinstance(m, AIMessage)
        for call in m.tool_calls
        if call["id"] not in answered
    ]
    if open_calls:
        raise ValueError(
            "Found AIMessages with tool_calls that do not have a corresponding ToolMessage. "
            f"Here are the first few of those tool calls: {open_calls[:3]}.\n\n"
            "Every tool call (LLM requesting to call a tool) in the message history MUST have "
            "a corresponding ToolMessage (result of a tool invocation to return to the LLM) - "
            "this is required by most LLM providers.\n"
            "For troubleshooting, visit: https://docs.langchain.com/oss/python/langgraph/"
            "errors/INVALID_CHAT_HISTORY"
        )


def _out_of_steps(state: Any, response: Any, direct: set[str]) -> bool:
    """Whether the run's recursion limit would stop the tool calls ``response`` asks for
    (and the model's next turn), by the state's ``remaining_steps``."""
    if isinstance(state, dict):
        remaining = state.get("remaining_steps")
    else:
        remaining = getattr(state, "remaining_steps", None)
    if remaining is None:
        return False
    calls = response.tool_calls if isinstance(response, AIMessage) else []
    all_direct = isinstance(response, AIMessage) and all(c["name"] in direct for c in calls)
    return (remaining < 1 and all_direct) or (remaining < 2 and bool(calls))


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
        message = None
        for message in reversed(_messages(state)):
            if not isinstance(message, ToolMessage):
                break
            if message.name in direct:
                return END
        # Parallel calls are tasks of their own, each routed on its own answer: one next to
        # a return_direct call ends the run too.
        if isinstance(message, AIMessage) and any(c["name"] in direct for c in message.tool_calls):
            return END
        return "agent"

    return route
