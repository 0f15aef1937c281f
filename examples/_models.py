"""The chat models of the examples: scripted by default, a real one when a variable names it.

Every example builds its agents' models with :func:`chat_model`, giving it a *script*: a plain
function from the conversation (and the names of the tools bound to the model) to the next
``AIMessage``. By default that script is the model (:class:`ScriptedChatModel`): no API key,
no network, and the same answer every run. Set ``BULKSYNC_EXAMPLE_MODEL`` to a model LangChain's
``init_chat_model`` knows, and every agent uses that model instead (the scripts are ignored;
the examples' prompts tell a real model what to do)::

    pip install langchain langchain-openai && export OPENAI_API_KEY=...
    BULKSYNC_EXAMPLE_MODEL=openai:gpt-4o-mini python examples/swarm.py

On a cluster, set it for the workers (they call the models). Why not langchain-core's
``GenericFakeChatModel``: it replays a list of replies, one per call, so each worker process
would replay the list from its own position; a script that decides from the conversation it
is given answers the same on every worker.

The helpers below (:func:`question`, :func:`results`, :func:`say`, :func:`calls`) are what the
scripts read and write conversations with.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

MODEL_VARIABLE = "BULKSYNC_EXAMPLE_MODEL"
"""Names a real chat model, as ``init_chat_model`` takes it (``openai:gpt-4o-mini``)."""

Script = Callable[[Sequence[BaseMessage], tuple[str, ...]], AIMessage]
"""The next reply to a conversation, given the names of the tools the model may call."""


class ScriptedChatModel(BaseChatModel):
    """A deterministic tool-calling chat model: its ``script`` decides every reply.

    ``bind_tools`` records the tools' names for the script. Tool calls the script leaves
    without an id get ``call_<conversation length>_<index>``: unique within a conversation
    and the same on every run.
    """

    script: Script
    tool_names: tuple[str, ...] = ()

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        names = tuple(convert_to_openai_tool(t)["function"]["name"] for t in tools)
        return self.model_copy(update={"tool_names": names})

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        reply = self.script(messages, self.tool_names)
        if reply.tool_calls:
            numbered = [
                {**c, "id": c.get("id") or f"call_{len(messages)}_{i}"}
                for i, c in enumerate(reply.tool_calls)
            ]
            reply = reply.model_copy(update={"tool_calls": numbered})
        return ChatResult(generations=[ChatGeneration(message=reply)])


def chat_model(script: Script) -> BaseChatModel:
    """The model an example's agent uses: ``script`` scripted, or the real model that
    ``BULKSYNC_EXAMPLE_MODEL`` names (which must support tool calling)."""
    name = os.environ.get(MODEL_VARIABLE, "").strip()
    return real_model(name) if name else ScriptedChatModel(script=script)


def real_model(name: str) -> BaseChatModel:
    """``init_chat_model(name)``; a missing package or an unknown model stops the program with
    one line saying what to do (an example that cannot build its model has nothing to run)."""
    try:
        from langchain.chat_models import init_chat_model  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise SystemExit(
            f"{MODEL_VARIABLE}={name!r} needs LangChain's init_chat_model: pip install langchain "
            f"{_provider_package(name)} (or unset {MODEL_VARIABLE} for the scripted models)"
        ) from None
    try:
        model: BaseChatModel = init_chat_model(name)
    except (ImportError, ValueError) as exc:  # the provider's package, or an unknown model
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SystemExit(f"{MODEL_VARIABLE}={name!r}: {first_line}") from None
    return model


PROVIDER_PACKAGES = {
    "azure_openai": "langchain-openai",
    "bedrock": "langchain-aws",
    "bedrock_converse": "langchain-aws",
    "anthropic_bedrock": "langchain-aws",
    "nvidia": "langchain-nvidia-ai-endpoints",
}
"""Providers whose LangChain package is not ``langchain-<provider>``."""


def _provider_package(name: str) -> str:
    """The package of the provider ``name`` starts with (``openai:`` → ``langchain-openai``)."""
    provider, colon, _ = name.partition(":")
    if not colon:
        return "langchain-<provider> (e.g. langchain-openai)"
    return PROVIDER_PACKAGES.get(provider, f"langchain-{provider.replace('_', '-')}")


# -- reading and writing conversations -----------------------------------------------------


def question(messages: Sequence[BaseMessage]) -> str:
    """The latest thing the user asked."""
    return next((str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage)), "")


def asked(messages: Sequence[BaseMessage]) -> list[str]:
    """Everything the user asked, latest first."""
    return [str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage)]


def results(messages: Sequence[BaseMessage], *tools: str) -> list[ToolMessage]:
    """The answers of ``tools`` since the user's latest question, oldest first."""
    found: list[ToolMessage] = []
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, ToolMessage) and message.name in tools:
            found.append(message)
    return found[::-1]


def say(text: str) -> AIMessage:
    """A reply with no tool calls."""
    return AIMessage(content=text)


def calls(*wanted: tuple[str, dict[str, Any]]) -> AIMessage:
    """A reply calling each ``(tool name, arguments)`` (at once: they run in parallel)."""
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args, "id": None} for name, args in wanted],
    )
