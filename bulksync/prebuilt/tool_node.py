"""``ToolNode`` and ``tools_condition``: run a model's tool calls, as langgraph.prebuilt does.

A ``ToolNode`` reads the tool calls of the last ``AIMessage`` in the state (or of a message
list, or one call sent on its own with ``Send("tools", {"__type": "tool_call_with_context",
"tool_call": …, "state": …})``) and invokes each tool with the whole call, as LangGraph does:
a tool may declare an ``InjectedToolCallId`` argument, and LangChain makes its answer a
``ToolMessage`` answering the call. A tool may answer with a ``ToolMessage`` or a ``Command``
of its own (a handoff: ``Command(goto=…, graph=Command.PARENT, update=…)``); the node checks
that a Command answers its call and returns it as LangGraph does. Arguments annotated
``InjectedState`` are filled from the graph state, ``InjectedStore`` with the graph's store;
both are hidden from the model. ``create_react_agent`` sends each call as a task of its own,
so on a cluster a model's parallel tool calls run on as many workers.

Error messages a model reads back keep LangGraph's wording: agents are prompted and tested
against it.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    RemoveMessage,
    ToolCall,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.messages.tool import ToolOutputMixin
from langchain_core.tools import BaseTool, InjectedToolArg
from langchain_core.tools import base as tools_base
from langchain_core.tools import tool as as_tool
from pydantic import ValidationError

from bulksync.constants import END
from bulksync.context import maybe_current_task
from bulksync.errors import GraphBubbleUp, is_invalid_resume
from bulksync.graph.message import REMOVE_ALL_MESSAGES
from bulksync.types import Command, Send

INVALID_TOOL_NAME = "Error: {requested_tool} is not a valid tool, try one of [{available_tools}]."
TOOL_CALL_ERROR = "Error: {error}\n Please fix your mistakes."
TOOL_INVOCATION_ERROR = (
    "Error invoking tool '{tool_name}' with kwargs {tool_kwargs} with error:\n"
    " {error}\n"
    " Please fix the error and try again."
)
NO_STORE = (
    "Cannot inject store into tools with InjectedStore annotations - "
    "please compile your graph with a store."
)
WITH_CONTEXT = "tool_call_with_context"
"""The ``__type`` of a single call sent to the node with the state it was made in."""

ErrorHandling = bool | str | Callable[..., str] | type[Exception] | tuple[type[Exception], ...]
InputKind = Literal["list", "dict", "tool_calls"]
"""What the node was given: a message list, a state, or a call sent with its state."""


class InjectedState(InjectedToolArg):
    """Marks a tool argument to fill from the graph state (all of it, or one ``field``)."""

    def __init__(self, field: str | None = None) -> None:
        self.field = field


class InjectedStore(InjectedToolArg):
    """Marks a tool argument to fill with the graph's store (``compile(store=...)``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Injected:
    state: dict[str, str | None]  # argument -> state field (None: the whole state)
    store: str | None  # the argument the store goes to
    hidden: frozenset[str]  # every argument the model may not set (InjectedToolArg)
    optional: frozenset[str]  # state arguments with a default: left out if the field is


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
        """``handle_tool_errors`` None is LangGraph's default: a call with arguments the tool
        rejects is answered with the error, any other error fails the node."""
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
        calls, state, kind = self._parse(state)
        task = maybe_current_task()
        store = task.runtime.store if task is not None and task.runtime is not None else None
        if len(calls) == 1:
            outputs = [self._run(calls[0], kind, state, store, config)]
        else:  # each call in a copy of this context (the task's), as LangChain's executor does
            contexts = [contextvars.copy_context() for _ in calls]
            with ThreadPoolExecutor(max_workers=len(calls)) as pool:
                futures = [
                    pool.submit(ctx.run, self._run, call, kind, state, store, config)
                    for ctx, call in zip(contexts, calls, strict=True)
                ]
                outputs = [f.result() for f in futures]
        return _combine(outputs, self.messages_key, kind)

    def _parse(self, value: Any) -> tuple[list[ToolCall], Any, InputKind]:
        if isinstance(value, dict) and value.get("__type") == WITH_CONTEXT:
            return [value["tool_call"]], value["state"], "tool_calls"
        kind: InputKind = "dict"
        if isinstance(value, list):
            messages, kind = value, "list"
        elif isinstance(value, dict):
            messages = value.get(self.messages_key, [])
        else:
            messages = getattr(value, self.messages_key, [])
        if not messages:
            raise ValueError("No message found in input")
        last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        if last is None:
            raise ValueError("No AIMessage found in input")
        return list(last.tool_calls), value, kind

    def _run(self, call: ToolCall, kind: InputKind, state: Any, store: Any, config: Any) -> Any:
        """One call's answer: a ToolMessage, a Command, or a list of them."""
        tool = self.tools_by_name.get(call["name"])
        if tool is None:
            content = INVALID_TOOL_NAME.format(
                requested_tool=call["name"], available_tools=", ".join(self.tools_by_name)
            )
            return ToolMessage(content, name=call["name"], tool_call_id=call["id"], status="error")
        injected = self._injected[call["name"]]
        given = self._inject(call, injected, state, store)  # its errors are never handled
        try:
            try:
                answer = tool.invoke({**given, "type": "tool_call"}, config)
            except ValidationError as exc:
                if is_invalid_resume(exc):  # an interrupt's answer, not the model's mistake
                    raise
                raise _InvalidArguments(call["name"], exc, call["args"], injected) from exc
            return self._checked(answer, call, kind)
        except GraphBubbleUp:  # an interrupt or a parent command: control flow, never handled
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            content = self._error_content(exc)
            return ToolMessage(content, name=call["name"], tool_call_id=call["id"], status="error")

    def _inject(self, call: ToolCall, injected: _Injected, state: Any, store: Any) -> ToolCall:
        """``call`` with the injected arguments set (any value the model gave them dropped)."""
        values: dict[str, Any] = {}
        if injected.state:
            if isinstance(state, list):  # a message list stands for a state of its messages
                fields = list(injected.state.values())
                if fields[0] is None or fields == [self.messages_key]:
                    state = {self.messages_key: state}
                else:
                    named = ", ".join(f for f in fields if f)
                    wanted = f" State should contain fields {named}." if named else ""
                    raise ValueError(
                        f"Invalid input to ToolNode. Tool {call['name']} requires graph state "
                        f"dict as input.{wanted}"
                    )
            for arg, field in injected.state.items():
                if not field:
                    values[arg] = state
                elif isinstance(state, dict):
                    if field in state:
                        values[arg] = state[field]
                    elif arg not in injected.optional:
                        raise KeyError(field)
                elif hasattr(state, field):
                    values[arg] = getattr(state, field)
                elif arg not in injected.optional:
                    raise AttributeError(field)
        if injected.store:
            if store is None:
                raise ValueError(NO_STORE)
            values[injected.store] = store
        args = {k: v for k, v in call["args"].items() if k not in injected.hidden}
        return {**call, "args": {**args, **values}}

    def _checked(self, answer: Any, call: ToolCall, kind: InputKind) -> Any:
        """A tool's answer as the node passes it on: a ToolMessage's content made message
        content, a Command checked to answer the call."""
        if isinstance(answer, Command):
            return self._checked_command(answer, call, kind)
        if isinstance(answer, ToolMessage):
            answer.content = _content(answer.content)
            return answer
        if isinstance(answer, list):
            if all(isinstance(a, Command | ToolMessage) for a in answer):
                return self._checked_list(answer, call, kind)
            raise TypeError(
                f"Tool {call['name']} returned a list with invalid element types: expected "
                "all Command or ToolMessage"
            )
        raise TypeError(f"Tool {call['name']} returned unexpected type: {type(answer)}")

    def _checked_list(self, answer: list[Any], call: ToolCall, kind: InputKind) -> list[Any]:
        """A list of Commands and ToolMessages answering one call: exactly one of its
        messages must answer it."""
        answering = 0
        for item in answer:
            if isinstance(item, ToolMessage):
                answering += item.tool_call_id == call["id"]
            elif isinstance(item.update, dict):
                answering += sum(
                    isinstance(m, ToolMessage) and m.tool_call_id == call["id"]
                    for m in item.update.get(self.messages_key, [])
                )
        if answering != 1:
            raise ValueError(
                f"Tool {call['name']} returned a list with {answering} messages bound to "
                f"tool_call_id {call['id']!r}; expected exactly one terminating ToolMessage."
            )
        checked: list[Any] = []
        for item in answer:
            if isinstance(item, Command):
                checked.append(self._checked_command(item, call, kind, must_answer=False))
            else:
                item.content = _content(item.content)
                checked.append(item)
        return checked

    def _checked_command(
        self, command: Command[Any], call: ToolCall, kind: InputKind, *, must_answer: bool = True
    ) -> Command[Any]:
        """A copy of ``command`` whose ToolMessage answering ``call`` is named after the
        tool; a Command to this graph must have one. Its update must fit the node's input
        (a dict for a state, a list for a message list)."""
        if isinstance(command.update, dict):
            if kind == "list":
                raise ValueError(
                    "Tools can provide a dict in Command.update only when using dict with "
                    f"'{self.messages_key}' key as ToolNode input, got: {command.update} for "
                    f"tool '{call['name']}'"
                )
            command = copy.deepcopy(command)
            messages = typing.cast(dict[str, Any], command.update).get(self.messages_key, [])
        elif isinstance(command.update, list):
            if kind != "list":
                raise ValueError(
                    "Tools can provide a list of messages in Command.update only when using "
                    f"list of messages as ToolNode input, got: {command.update} for tool "
                    f"'{call['name']}'"
                )
            command = copy.deepcopy(command)
            messages = command.update
        else:
            return command
        # Messages given as dicts or tuples are checked as messages, but left as they are.
        messages = convert_to_messages(messages)
        if messages == [RemoveMessage(id=REMOVE_ALL_MESSAGES)]:
            return command
        answered = False
        for message in messages:
            if isinstance(message, ToolMessage) and message.tool_call_id == call["id"]:
                message.name = call["name"]
                answered = True
        if must_answer and command.graph is None and not answered:
            answer = 'ToolMessage("Success", tool_call_id=tool_call_id), ...'
            example = (
                f'`Command(update={{"messages": [{answer}]}}, ...)`'
                if kind == "dict"
                else f"`Command(update=[{answer}], ...)`"
            )
            raise ValueError(
                f"Expected to have a matching ToolMessage in Command.update for tool "
                f"'{call['name']}', got: {messages}. Every tool call (LLM requesting to call a "
                "tool) in the message history MUST have a corresponding ToolMessage. You can "
                f"fix it by modifying the tool to return {example}."
            )
        return command

    def _error_content(self, exc: Exception) -> Any:
        """The ToolMessage content for ``exc`` as ``handle_tool_errors`` says; or raise it."""
        flag = self.handle_tool_errors
        if flag is None:  # LangGraph's default: only a call with invalid arguments is answered
            if isinstance(exc, _InvalidArguments):
                return exc.message
            raise exc
        if isinstance(flag, type) and issubclass(flag, Exception):
            handled: tuple[type[Exception], ...] = (flag,)
        elif isinstance(flag, tuple):
            handled = flag
        elif callable(flag) and not isinstance(flag, type):
            handled = _handled_types(flag)
        else:
            handled = (Exception,)
        if not flag or not isinstance(exc, handled):
            raise exc
        if isinstance(flag, bool | tuple | type):
            return TOOL_CALL_ERROR.format(error=repr(exc))
        if isinstance(flag, str):
            return flag
        if callable(flag):
            return flag(exc)
        raise ValueError(  # pragma: no cover - the annotation rules it out
            "Got unexpected type of `handle_tool_error`. Expected bool, str or callable. "
            f"Received: {flag}"
        )


class _InvalidArguments(Exception):
    """A tool call whose arguments the tool's schema rejects (the model's mistake)."""

    def __init__(
        self, tool: str, source: ValidationError, args: dict[str, Any], injected: _Injected
    ) -> None:
        hidden = {*injected.state, *([injected.store] if injected.store else [])}
        lines = [
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in source.errors()
            if e["loc"] and e["loc"][0] not in hidden
        ]
        self.message = TOOL_INVOCATION_ERROR.format(
            tool_name=tool, tool_kwargs=args, error="\n".join(lines)
        )
        super().__init__(self.message)


def _handled_types(handler: Callable[..., Any]) -> tuple[type[Exception], ...]:
    """The errors a ``handle_tool_errors`` function answers: those its (first) parameter's
    annotation names, a union of them, or every error when it names none."""
    params = list(inspect.signature(handler).parameters.values())
    if not params:
        return (Exception,)
    first = params[1] if params[0].name in ("self", "cls") and len(params) == 2 else params[0]
    hints = typing.get_type_hints(handler)
    if first.name not in hints:
        return (Exception,)
    if typing.get_origin(first.annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(first.annotation)
        if all(issubclass(m, Exception) for m in members):
            return tuple(members)
        raise ValueError(
            "All types in the error handler error annotation must be Exception types. For "
            "example, `def custom_handler(e: Union[ValueError, TypeError])`. Got "
            f"'{first.annotation}' instead."
        )
    named = hints[first.name]
    if Exception in named.__mro__:
        return (named,)
    raise ValueError(
        "Arbitrary types are not supported in the error handler signature. Please annotate "
        "the error with either a specific Exception type or a union of Exception types. For "
        "example, `def custom_handler(e: ValueError)` or `def custom_handler(e: "
        f"Union[ValueError, TypeError])`. Got '{named}' instead."
    )


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
    """Which arguments of ``tool`` bulksync fills in, from the annotations of its input
    schema and of its function (the schema's win)."""
    schema = tool.get_input_schema()
    func = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    hints = {
        **(typing.get_type_hints(func, include_extras=True) if func else {}),
        **tools_base.get_all_basemodel_annotations(schema),
    }
    fields = getattr(schema, "model_fields", {})
    state: dict[str, str | None] = {}
    store: str | None = None
    hidden: set[str] = set()
    optional: set[str] = set()
    for arg, hint in hints.items():
        if any(_is_marker(m, InjectedToolArg) for m in typing.get_args(hint)[1:]):
            hidden.add(arg)
        marker = _marker(hint, InjectedState)
        if marker is not None:
            state[arg] = marker.field if isinstance(marker, InjectedState) else None
            if state[arg] and arg in fields and not fields[arg].is_required():
                optional.add(arg)
        if _marker(hint, InjectedStore) is not None:
            store = arg
    return _Injected(state, store, frozenset(hidden), frozenset(optional))


def _marker(hint: Any, kind: type[InjectedToolArg]) -> Any:
    """The ``kind`` marker (an instance, or the class itself) in ``hint``'s arguments, found
    through ``Annotated`` and unions; None if there is none.

    Raises:
        ValueError: ``hint`` holds two of them.
    """
    found = [a for a in typing.get_args(hint) if _holds_marker(a, kind)]
    if len(found) > 1:
        raise ValueError(
            f"A tool argument should not be annotated with {kind.__name__} more than once. "
            f"Found: {found}"
        )
    if found:
        return found[0]
    return True if _holds_marker(hint, kind) else None


def _holds_marker(hint: Any, kind: type[InjectedToolArg]) -> bool:
    if _is_marker(hint, kind):
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_holds_marker(a, kind) for a in typing.get_args(hint))
    return origin is not None and _is_marker(origin, kind)


def _is_marker(value: Any, kind: type[InjectedToolArg]) -> bool:
    return isinstance(value, kind) or (isinstance(value, type) and issubclass(value, kind))


def _content(content: Any) -> Any:
    """A ToolMessage's content as LangGraph leaves it: text, or content blocks LangChain
    knows, as they are; anything else (a list of strings too) as JSON, or its text."""
    if isinstance(content, str) or (
        isinstance(content, list)
        and all(
            isinstance(i, dict) and i.get("type") in tools_base.TOOL_MESSAGE_BLOCK_TYPES
            for i in content
        )
    ):
        return content
    try:
        return json.dumps(content, ensure_ascii=False)
    except Exception:
        return str(content)


def _combine(outputs: list[Any], key: str, kind: InputKind) -> Any:
    """The node's update: the ToolMessages (a list, or under ``key``), or — when a tool
    answered with a Command — the Commands and the messages wrapped one by one, the parent
    Commands that only send merged into one, as LangGraph combines them."""
    flat = [o for output in outputs for o in (output if isinstance(output, list) else [output])]
    if not any(isinstance(o, Command) for o in flat):
        return flat if kind == "list" else {key: flat}
    combined: list[Any] = []
    sends: list[Send] = []
    for output in flat:
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
            combined.append([output] if kind == "list" else {key: [output]})
    if sends:
        combined.append(Command(graph=Command.PARENT, goto=sends))
    return combined


def _pass_commands_through() -> None:
    """Let a tool invoked with a tool call answer with a bulksync ``Command``.

    LangChain makes a tool's answer a ToolMessage unless it is a ``ToolOutputMixin`` (a
    message, or LangGraph's Command, which derives from it); bulksync's Command does not
    (bulksync's runtime does not import langchain-core), so it is let through here too, as
    is a list of them and of messages. Anything else keeps LangChain's wrapping."""
    wrap = tools_base._format_output
    if getattr(wrap, "_bulksync_commands", False):
        return

    def format_output(content: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(content, Command) or (
            isinstance(content, list)
            and content
            and any(isinstance(i, Command) for i in content)
            and all(isinstance(i, Command | ToolOutputMixin) for i in content)
        ):
            return content
        return wrap(content, *args, **kwargs)

    format_output._bulksync_commands = True  # type: ignore[attr-defined]
    tools_base._format_output = format_output


_pass_commands_through()
