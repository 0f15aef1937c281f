"""``ToolNode`` and ``tools_condition``: run a model's tool calls, as langgraph.prebuilt does.

A ``ToolNode`` reads the tool calls of the last ``AIMessage`` in the state (or of a message
list, or one call sent on its own with ``Send("tools", {"__type": "tool_call_with_context",
"tool_call": …, "state": …})``), runs each tool with the node's config and answers with one
``ToolMessage`` per call. A tool may answer with a ``Command`` instead; the node returns it
as LangGraph does. Arguments annotated ``InjectedState`` are filled from the graph state and
hidden from the model. ``create_react_agent`` sends each call as a task of its own, so on a
cluster a model's parallel tool calls run on as many workers.

Error messages a model reads back keep LangGraph's wording: agents are prompted and tested
against it.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolArg
from langchain_core.tools import tool as as_tool
from pydantic import ValidationError

from bulksync.constants import END
from bulksync.errors import GraphBubbleUp
from bulksync.types import Command, Send

INVALID_TOOL_NAME = "Error: {requested_tool} is not a valid tool, try one of [{available_tools}]."
TOOL_CALL_ERROR = "Error: {error}\n Please fix your mistakes."
TOOL_INVOCATION_ERROR = (
    "Error invoking tool '{tool_name}' with kwargs {tool_kwargs} with error:\n"
    " {error}\n"
    " Please fix the error and try again."
)
WITH_CONTEXT = "tool_call_with_context"
"""The ``__type`` of a single call sent to the node with the state it was made in."""

ErrorHandling = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]


class InjectedState(InjectedToolArg):
    """Marks a tool argument to fill from the graph state (all of it, or one ``field``)."""

    def __init__(self, field: str | None = None) -> None:
        self.field = field


class InjectedStore(InjectedToolArg):
    """Marks a tool argument to fill with the graph's store (None: bulksync has no store
    yet)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Injected:
    state: dict[str, str | None]  # argument -> state field (None: the whole state)
    store: tuple[str, ...]


class ToolNode:
    """A node that runs the tool calls of the last AI message and answers each."""

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: ErrorHandling | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.name = self.__name__ = name  # the node's name when added without one
        self.tags = tags
        self.messages_key = messages_key
        self.handle_tool_errors = handle_tool_errors
        self.tools_by_name = {
            t.name: t for t in (t if isinstance(t, BaseTool) else as_tool(t) for t in tools)
        }
        self._injected = {name: _injected_args(t) for name, t in self.tools_by_name.items()}

    def __call__(self, state: Any, config: Any) -> Any:
        """The node: run the calls (in parallel), combine the answers as LangGraph does."""
        calls, state, as_list = self._parse(state)
        if len(calls) == 1:
            outputs = [self._run(calls[0], state, config)]
        else:
            with ThreadPoolExecutor(max_workers=len(calls)) as pool:
                outputs = list(pool.map(lambda c: self._run(c, state, config), calls))
        return _combine(outputs, self.messages_key, as_list)

    def _parse(self, value: Any) -> tuple[list[ToolCall], Any, bool]:
        if isinstance(value, dict) and value.get("__type") == WITH_CONTEXT:
            return [value["tool_call"]], value["state"], False
        if isinstance(value, list):
            messages, as_list = value, True
        elif isinstance(value, dict):
            messages, as_list = value.get(self.messages_key, []), False
        else:
            messages, as_list = getattr(value, self.messages_key, []), False
        last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        if last is None:
            raise ValueError("No AIMessage found in input")
        return list(last.tool_calls), value, as_list

    def _run(self, call: ToolCall, state: Any, config: Any) -> Any:
        tool = self.tools_by_name.get(call["name"])
        if tool is None:
            content = INVALID_TOOL_NAME.format(
                requested_tool=call["name"], available_tools=", ".join(self.tools_by_name)
            )
            return ToolMessage(content, name=call["name"], tool_call_id=call["id"], status="error")
        injected = self._injected[call["name"]]
        args = {**call["args"], **_injections(injected, state)}
        # LangChain wraps any answer but its own Command class into a ToolMessage, so the tool
        # gets its arguments alone and the answer is wrapped here; a tool answering with
        # content and an artifact keeps LangChain's wrapping (it cannot answer a Command).
        with_artifact = getattr(tool, "response_format", "content") == "content_and_artifact"
        given = {**call, "args": args, "type": "tool_call"} if with_artifact else args
        try:
            try:
                answer = tool.invoke(given, config)
            except ValidationError as exc:
                raise _InvalidArguments(call["name"], exc, call["args"], injected) from exc
        except GraphBubbleUp:  # an interrupt or a parent command: control flow, never handled
            raise
        except Exception as exc:
            content = self._error_content(exc)
            return ToolMessage(content, name=call["name"], tool_call_id=call["id"], status="error")
        if isinstance(answer, ToolMessage | Command):
            return answer
        return ToolMessage(_content(answer), name=call["name"], tool_call_id=call["id"])

    def _error_content(self, exc: Exception) -> str:
        """The ToolMessage text for ``exc`` as ``handle_tool_errors`` says; or raise it."""
        flag = self.handle_tool_errors
        if flag is None:  # LangGraph's default: only a call with invalid arguments is answered
            if isinstance(exc, _InvalidArguments):
                return exc.message
            raise exc
        if flag is False:
            raise exc
        if isinstance(flag, type | tuple) and not isinstance(exc, flag):
            raise exc
        if isinstance(flag, str):
            return flag
        if callable(flag) and not isinstance(flag, type):
            return str(flag(exc))
        return TOOL_CALL_ERROR.format(error=repr(exc))


class _InvalidArguments(Exception):
    """A tool call whose arguments the tool's schema rejects (the model's mistake)."""

    def __init__(
        self, tool: str, source: ValidationError, args: dict[str, Any], injected: _Injected
    ) -> None:
        hidden = {*injected.state, *injected.store}
        lines = [
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in source.errors()
            if not (e["loc"] and e["loc"][0] in hidden)
        ]
        self.message = TOOL_INVOCATION_ERROR.format(
            tool_name=tool, tool_kwargs=args, error="\n".join(lines)
        )
        super().__init__(self.message)


def tools_condition(state: Any, messages_key: str = "messages") -> Literal["tools", "__end__"]:
    """``"tools"`` when the last message asks for tool calls, else END."""
    if isinstance(state, list):
        messages = state
    elif isinstance(state, dict):
        messages = state.get(messages_key, [])
    else:
        messages = getattr(state, messages_key, [])
    if not messages:
        raise ValueError(f"No messages found in input state to tool_edge: {state}")
    last = messages[-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def tool_call_sends(node: str, message: AnyMessage, state: Any) -> list[Send]:
    """One ``Send`` to ``node`` per tool call of ``message``, each with the state."""
    calls = message.tool_calls if isinstance(message, AIMessage) else []
    return [Send(node, {"__type": WITH_CONTEXT, "tool_call": c, "state": state}) for c in calls]


def _injected_args(tool: BaseTool) -> _Injected:
    """Which arguments of ``tool`` bulksync fills in (from its ``InjectedState``/``Store``)."""
    state: dict[str, str | None] = {}
    store: list[str] = []
    schema = getattr(tool, "args_schema", None) or getattr(tool, "get_input_schema", None)
    hints = typing.get_type_hints(schema, include_extras=True) if isinstance(schema, type) else {}
    for arg, hint in hints.items():
        for marker in typing.get_args(hint)[1:] if typing.get_origin(hint) else ():
            if marker is InjectedState or isinstance(marker, InjectedState):
                state[arg] = getattr(marker, "field", None)
            elif marker is InjectedStore or isinstance(marker, InjectedStore):
                store.append(arg)
    return _Injected(state, tuple(store))


def _injections(injected: _Injected, state: Any) -> dict[str, Any]:
    values: dict[str, Any] = {arg: None for arg in injected.store}
    for arg, field in injected.state.items():
        if field is None:
            values[arg] = state
        else:
            values[arg] = state[field] if isinstance(state, dict) else getattr(state, field)
    return values


def _content(answer: Any) -> str | list[Any]:
    """A tool's answer as message content: text or content blocks as they are, anything
    else as JSON (or its text), as LangChain turns a tool's answer into a ToolMessage."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, list | tuple) and all(
        isinstance(i, str) or (isinstance(i, dict) and "type" in i) for i in answer
    ):
        return list(answer)
    try:
        return json.dumps(answer, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(answer)


def _combine(outputs: list[Any], key: str, as_list: bool) -> Any:
    """The node's update: the ToolMessages (a list, or under ``key``), or — when a tool
    answered with a Command — the Commands and the messages wrapped one by one, the parent
    Commands that only send merged into one, as LangGraph combines them."""
    if not any(isinstance(o, Command) for o in outputs):
        return outputs if as_list else {key: outputs}
    combined: list[Any] = []
    sends: list[Send] = []
    for output in outputs:
        goto = output.goto if isinstance(output, Command) else None
        if (
            isinstance(output, Command)
            and output.graph == Command.PARENT
            and isinstance(goto, list)
            and all(isinstance(g, Send) for g in goto)
        ):
            sends.extend(goto)
        elif isinstance(output, Command):
            combined.append(output)
        else:
            combined.append([output] if as_list else {key: [output]})
    if sends:
        combined.append(Command(graph=Command.PARENT, goto=sends))
    return combined
