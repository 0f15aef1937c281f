"""The ``messages`` reducer and state schema (LangGraph's ``langgraph.graph.message``).

``add_messages`` appends messages, replaces a message whose id is already present, and deletes
by id on a removal. It has two modes, chosen on each call:

- **langchain_core installed**: every input is coerced to a langchain_core message exactly as
  LangGraph does (dicts, ``(role, content)`` pairs and strings become ``HumanMessage``,
  ``AIMessage``…; chunks become plain messages), ids are set on the message objects, and
  ``RemoveMessage`` deletes. The result is what LangGraph's reducer returns.
- **langchain_core absent**: messages stay plain dicts. A ``(role, content)`` pair becomes
  ``{"role": role, "content": content}``, a string becomes a ``"user"`` message, and a missing id
  is set in a copy of the dict, so the caller's dicts are never changed. A dict whose role (or
  type) is ``"remove"`` deletes the message with its id.

langchain_core is imported on each call, not at import time, so it is never a dependency of
bulksync; importing an already loaded module costs one dictionary lookup.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Final, Literal, TypedDict, overload

from bulksync.context import current_task
from bulksync.errors import InvalidUpdateError, describe_type
from bulksync.graph.state import StateGraph
from bulksync.warnings import LangGraphDeprecatedSinceV10

__all__ = (
    "REMOVE_ALL_MESSAGES",
    "MessageGraph",
    "Messages",
    "MessagesState",
    "add_messages",
    "push_message",
)

REMOVE_ALL_MESSAGES: Final = "__remove_all__"
"""Id of a removal that clears every message before it (LangGraph's value)."""

Messages = list[Any] | Any
"""One message or a list of them, in any form ``add_messages`` accepts."""

Format = Literal["langchain-openai"] | None

_FORMATS: Final = (None, "langchain-openai")
# The roles langchain_core accepts in a message dict, so a dict that works without it also
# works once it is installed.
_ROLES: Final = frozenset(
    {"human", "user", "ai", "assistant", "system", "developer", "function", "tool", "remove"}
)


@overload
def add_messages(
    left: None = None, right: None = None, *, format: Format = None
) -> Callable[[Messages, Messages], Messages]: ...


@overload
def add_messages(left: Messages, right: Messages, *, format: Format = None) -> Messages: ...


def add_messages(
    left: Messages | None = None, right: Messages | None = None, *, format: Format = None
) -> Messages | Callable[[Messages, Messages], Messages]:
    """Merge ``right`` into ``left`` by message id; with no arguments, return a configured reducer.

    Raises:
        ValueError: only one of ``left``/``right`` is given, or ``format`` is unknown.
        InvalidUpdateError: a removal names an id not in ``left``, or a message is malformed.
    """
    # Both misuses raise LangGraph's own bare ValueError: add_messages is its API, verbatim.
    if format not in _FORMATS:
        raise ValueError(
            f"add_messages: Unrecognized format={format!r}; use 'langchain-openai' or None."
        )
    if left is None and right is None:
        return partial(_merge_messages, format=format)
    if left is None or right is None:
        given = "left" if right is None else "right"
        raise ValueError(
            f"add_messages: got only '{given}'; pass both 'left' and 'right', or neither to get "
            "a reducer configured by keyword arguments."
        )
    return _merge_messages(left, right, format=format)


class MessagesState(TypedDict):
    """A state schema holding one ``messages`` list reduced by ``add_messages``."""

    messages: Annotated[list[Any], add_messages]


def _merge_messages(left: Messages, right: Messages, *, format: Format = None) -> Messages:
    """Coerce both sides, give every message an id, then apply ``right`` to ``left``."""
    lc = _langchain()
    # Anything but a list is one message, a (role, content) tuple included, as in LangGraph.
    lefts = left if isinstance(left, list) else [left]
    rights = right if isinstance(right, list) else [right]
    if lc is None:
        if format is not None:
            raise ImportError(
                f"add_messages(format={format!r}) needs langchain-core: install it "
                "(pip install langchain-core) or drop the format argument."
            )
        lefts = [_with_id(_as_dict(m, "left", i)) for i, m in enumerate(lefts)]
        rights = [_with_id(_as_dict(m, "right", i)) for i, m in enumerate(rights)]
        kept = _after_remove_all(rights, _dict_id, _is_dict_removal)
        return kept if kept is not None else _apply(lefts, rights, _dict_id, _is_dict_removal)
    lefts = _with_object_ids(_to_langchain(lc, lefts))
    rights = _with_object_ids(_to_langchain(lc, rights))

    def is_removal(message: Any) -> bool:
        return isinstance(message, lc.RemoveMessage)

    kept = _after_remove_all(rights, _object_id, is_removal)
    if kept is not None:
        # LangGraph formats only a merge, not what is left after a remove-all.
        return kept
    merged = _apply(lefts, rights, _object_id, is_removal)
    if format is not None:
        return list(lc.convert_to_messages(lc.convert_to_openai_messages(merged)))
    return merged


def _after_remove_all(
    right: list[Any], id_of: Callable[[Any], str], is_removal: Callable[[Any], bool]
) -> list[Any] | None:
    """Return what follows the last remove-all in ``right``, or None if there is none."""
    for idx in range(len(right) - 1, -1, -1):
        if is_removal(right[idx]) and id_of(right[idx]) == REMOVE_ALL_MESSAGES:
            return right[idx + 1 :]
    return None


def _apply(
    left: list[Any],
    right: list[Any],
    id_of: Callable[[Any], str],
    is_removal: Callable[[Any], bool],
) -> list[Any]:
    """Apply ``right`` (all with ids) to ``left`` in order: replace, append or remove by id."""
    merged = list(left)
    position = {id_of(m): i for i, m in enumerate(merged)}
    doomed: set[str] = set()
    for m in right:
        mid = id_of(m)
        at = position.get(mid)
        if at is None:
            if is_removal(m):
                raise InvalidUpdateError(
                    "add_messages: Attempting to delete a message with an ID that doesn't exist "
                    f"('{mid}'). Remove only ids already in the list."
                )
            position[mid] = len(merged)
            merged.append(m)
        elif is_removal(m):
            doomed.add(mid)
        else:
            # A later message with the id of a removed one brings it back.
            doomed.discard(mid)
            merged[at] = m
    if doomed:
        merged = [m for m in merged if id_of(m) not in doomed]
    return merged


def push_message(message: Any, *, state_key: str | None = "messages") -> Any:
    """From a running node: stream ``message`` on the ``messages`` mode now, and write it to
    the ``state_key`` channel (none if None) with the node's other writes (LangGraph's).

    ``message`` is a langchain-core message or anything that converts to one (a dict, a
    ``(role, content)`` pair); the one streamed and written is returned.

    Raises:
        ValueError: the message has no id (one is needed to find it in the state again).
        RuntimeError: outside a node bulksync is running.
        ImportError: langchain-core is not installed.
    """
    from langchain_core.messages import convert_to_messages

    ctx = current_task()
    converted = convert_to_messages([message])[0]
    if converted.id is None:
        raise ValueError("Message ID is required: push_message(...) needs a message with an id.")
    if ctx.messages is not None:
        ctx.messages.pass_on(converted, dict(ctx.messages.metadata), once=False)
    if state_key:
        ctx.send([(state_key, converted)])
    return converted


def _langchain() -> Any | None:
    """Return ``langchain_core.messages`` if it can be imported, else None."""
    try:
        import langchain_core.messages as lc
    except ImportError:
        return None
    return lc


def _to_langchain(lc: Any, messages: list[Any]) -> list[Any]:
    """Coerce to langchain_core messages as LangGraph does (chunks become whole messages)."""
    kinds = {type(m) for m in messages}
    if all(issubclass(k, lc.BaseMessage) and not issubclass(k, lc.BaseMessageChunk) for k in kinds):
        # A long history is all plain messages already: skip the per-item conversion.
        return messages
    return [lc.message_chunk_to_message(m) for m in lc.convert_to_messages(messages)]


def _with_object_ids(messages: list[Any]) -> list[Any]:
    """Set a fresh id on each message object that has none (in place, as LangGraph does)."""
    for m in messages:
        if m.id is None:
            m.id = str(uuid.uuid4())
    return messages


def _object_id(message: Any) -> str:
    mid: str = message.id
    return mid


def _as_dict(message: Any, side: str, index: int) -> dict[str, Any]:
    """Turn a plain-mode message into a dict with a role, or raise naming where it was."""
    where = f"add_messages: {side} message #{index}"
    if isinstance(message, str):
        return {"role": "user", "content": message}
    if isinstance(message, tuple | list):
        if len(message) != 2:
            raise InvalidUpdateError(
                f"{where} is a sequence of {len(message)} items; write it as (role, content)."
            )
        message = {"role": message[0], "content": message[1]}
    if not isinstance(message, dict):
        raise InvalidUpdateError(
            f"{where} has type {describe_type(message)}; without langchain-core installed a "
            "message must be a dict, a (role, content) pair or a string."
        )
    role = message.get("role", message.get("type"))
    if role is None or "content" not in message:
        raise InvalidUpdateError(
            f"{where} must have a 'role' (or 'type') and a 'content' key, got {message!r}."
        )
    if role not in _ROLES:
        raise InvalidUpdateError(f"{where} has unknown role {role!r}; use one of {sorted(_ROLES)}.")
    return message


def _with_id(message: dict[str, Any]) -> dict[str, Any]:
    """Return ``message`` if it has an id, else a copy with a fresh one under ``"id"``."""
    if message.get("id") is not None:
        return message
    return {**message, "id": str(uuid.uuid4())}


def _dict_id(message: dict[str, Any]) -> str:
    mid: str = message["id"]
    return mid


def _is_dict_removal(message: dict[str, Any]) -> bool:
    return message.get("role", message.get("type")) == "remove"


class MessageGraph(StateGraph[Any]):
    """LangGraph's deprecated graph whose whole state is one list of messages, merged with
    ``add_messages``: nodes take the list and return messages to add. Deprecated as in
    LangGraph: use a ``StateGraph`` with a ``messages`` key (``MessagesState``) instead."""

    def __init__(self) -> None:
        warnings.warn(
            "MessageGraph is deprecated in LangGraph v1.0.0, to be removed in v2.0.0. Please "
            "use StateGraph with a `messages` key instead.",
            category=LangGraphDeprecatedSinceV10,
            stacklevel=2,
        )
        root: Any = Annotated[list, add_messages]  # a root schema: the state is the list
        super().__init__(root)
