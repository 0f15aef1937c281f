"""ToolNode's answers and errors, tools_condition, and create_react_agent's options."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool

from bulksync.constants import END
from bulksync.errors import ConfigError
from bulksync.prebuilt import InjectedState, ToolNode, create_react_agent, tools_condition
from bulksync.types import Command


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@tool
def last_words(state: Annotated[list[Any], InjectedState("messages")]) -> str:
    """The text of the last message."""
    return str(state[-1].content)


@tool
def hand_over(target: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Hand the conversation over (answering the call that asked for it)."""
    done = ToolMessage(f"over to {target}", tool_call_id=tool_call_id)
    return Command(goto=target, update={"messages": [done], "handled_by": target})


@tool
def hand_over_silently(target: str) -> Command[Any]:
    """Hand the conversation over without answering the call."""
    return Command(goto=target, update={"handled_by": target})


class ToolCallingFake(GenericFakeChatModel):
    """A scripted chat model that accepts tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def calls(*pairs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    tool_calls = [{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(pairs)]
    return {"messages": [HumanMessage("hi"), AIMessage("", tool_calls=tool_calls)]}


def contents(update: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m.content, m.status) for m in update["messages"]]


def test_a_tools_own_error_is_raised_by_default_and_answered_when_asked() -> None:
    state = calls(("divide", {"a": 1, "b": 0}))
    with pytest.raises(ZeroDivisionError):
        ToolNode([divide])(state, {})
    answered = ToolNode([divide], handle_tool_errors=True)(state, {})
    assert contents(answered) == [
        ("Error: ZeroDivisionError('division by zero')\n Please fix your mistakes.", "error")
    ]
    assert contents(ToolNode([divide], handle_tool_errors="nope")(state, {})) == [("nope", "error")]
    custom = ToolNode([divide], handle_tool_errors=lambda e: f"bad: {type(e).__name__}")
    assert contents(custom(state, {})) == [("bad: ZeroDivisionError", "error")]
    with pytest.raises(ZeroDivisionError):  # a type filter that does not match: raised
        ToolNode([divide], handle_tool_errors=ValueError)(state, {})


def test_bad_arguments_and_unknown_tools_are_answered_for_the_model_to_fix() -> None:
    update = ToolNode([divide])(calls(("divide", {"a": "x", "b": 1}), ("ghost", {})), {})
    (bad, bad_status), (ghost, ghost_status) = contents(update)
    assert bad.startswith("Error invoking tool 'divide' with kwargs {'a': 'x', 'b': 1}")
    assert ghost == "Error: ghost is not a valid tool, try one of [divide]."
    assert bad_status == ghost_status == "error"


def test_injected_state_is_filled_and_hidden_from_the_model() -> None:
    update = ToolNode([last_words])(calls(("last_words", {})), {})
    assert [m.content for m in update["messages"]] == [""]  # the AI message's content
    assert "state" not in last_words.tool_call_schema.model_json_schema()["properties"]


def test_a_tool_answering_with_a_command_is_passed_on() -> None:
    out = ToolNode([hand_over, divide])(
        calls(("hand_over", {"target": "billing"}), ("divide", {"a": 4, "b": 2})), {}
    )
    assert out[0].goto == "billing" and out[0].update["handled_by"] == "billing"
    (answer,) = out[0].update["messages"]  # named after the tool, as LangGraph names it
    assert [answer.content, answer.tool_call_id, answer.name] == [
        "over to billing",
        "c0",
        "hand_over",
    ]
    assert [m.content for m in out[1]["messages"]] == ["2.0"]


def test_a_command_must_answer_its_call() -> None:
    state = calls(("hand_over_silently", {"target": "billing"}))
    with pytest.raises(ValueError, match="MUST have a corresponding ToolMessage"):
        ToolNode([hand_over_silently])(state, {})


def test_tools_condition_routes_on_the_last_message() -> None:
    assert tools_condition(calls(("divide", {}))) == "tools"
    assert tools_condition({"messages": [AIMessage("done")]}) == END
    assert tools_condition([AIMessage("done")]) == END
    with pytest.raises(ValueError, match="No messages"):
        tools_condition({"messages": []})


def test_return_direct_ends_the_run_with_the_tools_answer() -> None:
    @tool(return_direct=True)
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    call = {"name": "lookup", "args": {"key": "k"}, "id": "l"}
    model = ToolCallingFake(messages=iter([AIMessage("", tool_calls=[call])]))
    out = create_react_agent(model, [lookup]).invoke({"messages": [("user", "k?")]})
    last = out["messages"][-1]
    assert isinstance(last, ToolMessage) and last.content == "value of k"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"model": "openai:gpt-4o"}, "pass a chat model object"), ({"version": "v3"}, "'v1' or 'v2'")],
)
def test_bad_agent_options_name_the_argument(kwargs: dict[str, Any], match: str) -> None:
    args = {"model": GenericFakeChatModel(messages=iter([])), "tools": [divide], **kwargs}
    with pytest.raises(ConfigError, match=match):
        create_react_agent(**args)
