"""add_messages behaves like LangGraph's, with langchain_core messages and with plain dicts."""

from __future__ import annotations

import copy
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bulksync.errors import InvalidUpdateError
from bulksync.graph.message import REMOVE_ALL_MESSAGES, MessagesState, add_messages

lc = pytest.importorskip("langchain_core.messages")
lg_message = pytest.importorskip("langgraph.graph.message")

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def normalise(messages: Any) -> Any:
    """Rename generated (uuid4) ids gen-0, gen-1… in order of appearance."""
    out = copy.deepcopy(messages)
    names: dict[str, str] = {}
    for m in out:
        mid = m.get("id") if isinstance(m, dict) else m.id
        if isinstance(mid, str) and UUID.match(mid):
            new = names.setdefault(mid, f"gen-{len(names)}")
            if isinstance(m, dict):
                m["id"] = new
            else:
                m.id = new
    return out


def both(left: Any, right: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Run ours and LangGraph's reducer on separate copies (both set ids in place)."""
    ours = add_messages(copy.deepcopy(left), copy.deepcopy(right), **kwargs)
    theirs = lg_message.add_messages(copy.deepcopy(left), copy.deepcopy(right), **kwargs)
    return ours, theirs


H, A, S, T = lc.HumanMessage, lc.AIMessage, lc.SystemMessage, lc.ToolMessage
RM = lc.RemoveMessage
CALL = {"name": "search", "args": {"q": "x"}, "id": "call-1", "type": "tool_call"}

CASES: dict[str, tuple[Any, Any]] = {
    "dicts": ([], [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]),
    "type-key": ([], [{"type": "human", "content": "hi", "id": "1"}]),
    "tuples": ([("system", "be nice")], [("user", "hi"), ("ai", "hello")]),
    "strings": (["first"], ["second", "third"]),
    "single-right": ([H("a", id="1")], ("assistant", "b")),
    "single-string": ("solo", "other"),
    "list-pair": ([], [["human", "hi"]]),
    "empty-both": ([], []),
    "none-content": ([], [{"role": "user", "content": None}]),
    "objects": ([H("a", id="1")], [A("b", id="2"), S("c")]),
    "replace": ([H("a", id="1"), A("b", id="2")], [H("a2", id="1")]),
    "replace-by-dict": ([H("a", id="1")], [{"role": "ai", "content": "z", "id": "1"}]),
    "dup-in-right": ([], [H("x", id="7"), A("y", id="7")]),
    "left-without-ids": ([H("a"), ("ai", "b")], [H("c", id="3")]),
    "chunk": ([H("a", id="1")], [lc.AIMessageChunk(content="part", id="c1")]),
    "chunk-list": ([], [lc.AIMessageChunk(content="x"), lc.HumanMessageChunk(content="y")]),
    "remove": ([H("a", id="1"), A("b", id="2")], [RM(id="1")]),
    "remove-dict": ([H("a", id="1")], [{"role": "remove", "id": "1", "content": ""}]),
    "remove-then-readd": ([H("a", id="1"), A("b", id="2")], [RM(id="1"), H("again", id="1")]),
    "add-then-remove": ([H("a", id="1")], [A("new", id="9"), RM(id="9")]),
    "remove-all": ([H("a", id="1")], [RM(id=REMOVE_ALL_MESSAGES), ("user", "fresh")]),
    "remove-all-last-wins": (
        [H("a", id="1")],
        [("user", "x"), RM(id=REMOVE_ALL_MESSAGES), ("ai", "y"), RM(id=REMOVE_ALL_MESSAGES)],
    ),
    "remove-all-keeps-later-removals": ([H("a", id="1")], [RM(id=REMOVE_ALL_MESSAGES), RM(id="z")]),
    "remove-all-dict": ([H("a")], [{"type": "remove", "id": REMOVE_ALL_MESSAGES, "content": ""}]),
    "tool-calls": (
        [],
        [A("", id="a1", tool_calls=[CALL]), T("result", tool_call_id="call-1", id="t1")],
    ),
    "openai-tool-dicts": (
        [],
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "x"}'},
                    }
                ],
            },
            {"role": "tool", "content": "found", "tool_call_id": "call-1"},
        ],
    ),
    "developer-role": ([], [{"role": "developer", "content": "rules", "name": "ops"}]),
    "lc-envelope": (
        [],
        [{"lc": 1, "type": "constructor", "id": ["x", "AIMessage"], "kwargs": {"content": "z"}}],
    ),
}


@pytest.mark.parametrize(("left", "right"), list(CASES.values()), ids=list(CASES))
def test_merges_like_langgraph(left: Any, right: Any) -> None:
    ours, theirs = both(left, right)
    assert normalise(ours) == normalise(theirs)
    assert all(isinstance(m.id, str) for m in ours)


FORMAT_CASES = {
    "blocks": (
        [H("a", id="1")],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look:"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                    },
                ],
            }
        ],
    ),
    "remove-all-is-not-formatted": (
        [H("a", id="1")],
        [RM(id=REMOVE_ALL_MESSAGES), H([{"type": "text", "text": "x"}], id="2")],
    ),
}


@pytest.mark.parametrize(("left", "right"), list(FORMAT_CASES.values()), ids=list(FORMAT_CASES))
def test_openai_format_like_langgraph(left: Any, right: Any) -> None:
    ours, theirs = both(left, right, format="langchain-openai")
    assert normalise(ours) == normalise(theirs)
    configured = add_messages(format="langchain-openai")
    assert normalise(configured(copy.deepcopy(left), copy.deepcopy(right))) == normalise(theirs)


ERROR_CASES: dict[str, tuple[Any, Any]] = {
    "remove-unknown-id": ([H("a", id="1")], [RM(id="nope")]),
    "dict-without-content": ([], [{"role": "user"}]),
    "unknown-role": ([], [{"role": "robot", "content": "x"}]),
    "three-tuple": ([], [("user", "x", "y")]),
    "unsupported-type": ([], [42]),
}


@pytest.mark.parametrize(("left", "right"), list(ERROR_CASES.values()), ids=list(ERROR_CASES))
def test_fails_like_langgraph(left: Any, right: Any) -> None:
    with pytest.raises(Exception) as theirs:
        lg_message.add_messages(copy.deepcopy(left), copy.deepcopy(right))
    with pytest.raises(type(theirs.value)):
        add_messages(left, right)


def test_remove_of_unknown_id_names_it() -> None:
    with pytest.raises(InvalidUpdateError, match="'nope'"):
        add_messages([H("a", id="1")], [RM(id="nope")])


def test_ids_are_fresh_uuid4_and_set_in_place_like_langgraph() -> None:
    left, right = [H("a")], [A("b")]
    merged = add_messages(left, right)
    assert [m.id for m in merged] == [left[0].id, right[0].id]
    assert all(UUID.match(m.id) for m in merged)
    assert left[0].id != right[0].id


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: add_messages([H("a")]), "only 'left'"),  # type: ignore[call-overload]
        (lambda: add_messages(None, [H("a")]), "only 'right'"),
        (lambda: add_messages(format="xml"), "format='xml'"),  # type: ignore[call-overload]
    ],
)
def test_bad_calls_raise_value_error(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_reducer_takes_two_positional_arguments() -> None:
    for reducer in (add_messages, add_messages(format="langchain-openai")):
        params = inspect.signature(reducer).parameters.values()
        positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert len(positional) == 2


def test_messages_state_declares_the_reducer() -> None:
    hints = typing.get_type_hints(MessagesState, include_extras=True)
    assert list(hints) == ["messages"]
    assert typing.get_origin(hints["messages"]) is typing.Annotated
    assert hints["messages"].__metadata__ == (add_messages,)


def test_messages_state_runs_in_a_langgraph_state_graph_like_its_own() -> None:
    lg_graph = pytest.importorskip("langgraph.graph")

    def reply(state: Any) -> dict[str, Any]:
        return {"messages": [("ai", f"seen {len(state['messages'])}")]}

    results = []
    for schema in (MessagesState, lg_message.MessagesState):
        builder = lg_graph.StateGraph(schema)
        builder.add_node("reply", reply)
        builder.add_edge(lg_graph.START, "reply")
        out = builder.compile().invoke({"messages": [("user", "hi"), "there"]})
        results.append(normalise(out["messages"]))
    assert results[0] == results[1]
    assert [m.content for m in results[0]] == ["hi", "there", "seen 2"]


# --- without langchain_core ---------------------------------------------------------------------


@pytest.fixture
def no_langchain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make ``import langchain_core.messages`` fail, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "langchain_core.messages", None)
    yield


def plain(messages: Any) -> list[tuple[Any, Any]]:
    """(content, id) of dicts or message objects, to compare the two modes."""
    return [
        (m["content"], m["id"]) if isinstance(m, dict) else (m.content, m.id)
        for m in normalise(messages)
    ]


PLAIN_CASES = {
    name: CASES[name]
    for name in (
        "dicts",
        "type-key",
        "tuples",
        "strings",
        "single-string",
        "list-pair",
        "empty-both",
        "developer-role",
    )
}
A1 = {"role": "user", "content": "a", "id": "1"}
B2 = {"role": "ai", "content": "b", "id": "2"}
PLAIN_CASES |= {
    "dup-in-right": ([], [{**A1, "id": "7"}, {**B2, "id": "7"}]),
    "replace": ([A1, B2], [{"role": "user", "content": "a2", "id": "1"}]),
    "remove-dict": ([A1, B2], [{"role": "remove", "id": "1", "content": ""}]),
    "remove-then-readd": (
        [A1, B2],
        [{"role": "remove", "id": "1", "content": ""}, {"role": "user", "content": "c", "id": "1"}],
    ),
    "add-then-remove": ([A1], [B2, {"type": "remove", "id": "2", "content": ""}]),
    "remove-all-dict": (
        [A1],
        [("user", "x"), {"type": "remove", "id": REMOVE_ALL_MESSAGES, "content": ""}, "y"],
    ),
}


@pytest.mark.parametrize(("left", "right"), list(PLAIN_CASES.values()), ids=list(PLAIN_CASES))
def test_plain_dicts_merge_like_langgraph(no_langchain: None, left: Any, right: Any) -> None:
    ours = add_messages(copy.deepcopy(left), copy.deepcopy(right))
    assert all(isinstance(m, dict) for m in ours)
    theirs = lg_message.add_messages(copy.deepcopy(left), copy.deepcopy(right))
    assert plain(ours) == plain(theirs)


def test_plain_ids_go_into_copies(no_langchain: None) -> None:
    given = {"role": "user", "content": "hi"}
    kept = {"role": "ai", "content": "yo", "id": "k"}
    merged = add_messages([given], [kept, ("tool", "out")])
    assert given == {"role": "user", "content": "hi"}
    assert merged[0] == {**given, "id": merged[0]["id"]}
    assert UUID.match(merged[0]["id"])
    assert merged[1] is kept
    assert merged[2] == {"role": "tool", "content": "out", "id": merged[2]["id"]}


def test_plain_string_is_a_user_message(no_langchain: None) -> None:
    [message] = add_messages([], "hello")
    assert (message["role"], message["content"]) == ("user", "hello")


@pytest.mark.parametrize(
    ("right", "match"),
    [
        ([42], r"right message #0 has type builtins\.int"),
        ([("user", "a", "b")], "sequence of 3 items"),
        ([{"role": "user"}], "'content' key"),
        ([{"content": "x"}], "'role'"),
        ([{"role": "robot", "content": "x"}], "unknown role 'robot'"),
        ([{"role": "remove", "id": "gone", "content": ""}], "'gone'"),
    ],
)
def test_plain_errors_say_what_is_wrong(no_langchain: None, right: Any, match: str) -> None:
    with pytest.raises(InvalidUpdateError, match=match):
        add_messages([], right)


def test_plain_format_needs_langchain(no_langchain: None) -> None:
    with pytest.raises(ImportError, match="langchain-core"):
        add_messages([], [("user", "x")], format="langchain-openai")


def test_message_graph_is_deprecated_and_runs_on_a_list_of_messages() -> None:
    from bulksync.graph import START, MessageGraph
    from bulksync.warnings import LangGraphDeprecatedSinceV10

    with pytest.warns(LangGraphDeprecatedSinceV10, match="Please use StateGraph with a `messages`"):
        builder = MessageGraph()
    builder.add_node("count", lambda messages: [("ai", f"{len(messages)} so far")])
    builder.add_edge(START, "count")
    out = builder.compile().invoke([("user", "hi"), ("user", "there")])
    assert [(m.type, m.content) for m in out] == [
        ("human", "hi"),
        ("human", "there"),
        ("ai", "2 so far"),
    ]
