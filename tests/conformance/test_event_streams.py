"""``stream_events(version="v3")``: a run as projections its reader drives.

Values, output, interrupts and errors at the root; a handle per subgraph with its own
projections and how it ended; the lifecycle log; chat-model replies as ``ChatModelStream``s
(their text, as it streams, and whole messages a node returns); transformers of the caller's
own; and the async twin.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from .harness import Conform
from .impls import Impl

pytestmark = [
    pytest.mark.conformance,
    # LangGraph marks its v3 protocol experimental with a warning on every call.
    pytest.mark.filterwarnings("ignore:The v3 streaming protocol"),
]


class State(TypedDict):
    value: str
    items: Annotated[list[str], operator.add]


START_VALUES = {"value": "x", "items": []}
NATIVE = ("values", "messages", "lifecycle", "subgraphs")


def _chain(impl: Impl, *names: str, fail: str | None = None) -> Any:
    def step(name: str) -> Any:
        def node(state: State) -> dict[str, Any]:
            if name == fail:
                raise ValueError(f"{name} broke")
            return {"value": state["value"] + name, "items": [name]}

        return node

    b = impl.StateGraph(State)
    for name in names:
        b.add_node(name, step(name))
    b.add_edge(impl.START, names[0])
    for a, z in itertools.pairwise(names):
        b.add_edge(a, z)
    return b


def _with_subgraph(impl: Impl, *, fail: str | None = None) -> Any:
    inner = _chain(impl, "a", "b", fail=fail).compile()
    outer = _chain(impl, "first")
    outer.add_node("inner", inner)
    outer.add_edge("first", "inner")
    return impl.compile(outer)


def _error(exc: BaseException) -> tuple[str, str]:
    return (type(exc).__name__, str(exc))


def root_projections(impl: Impl) -> Any:
    graph = impl.compile(_chain(impl, "a", "b"))
    run = graph.stream_events(START_VALUES, version="v3")
    values = list(run.values)
    events = graph.stream_events(START_VALUES, version="v3")
    methods = [(e["method"], e["seq"]) for e in events]
    return {
        "values": values,
        "output": run.output,
        "interrupted": run.interrupted,
        "events": methods,
        "native": sorted(k for k in NATIVE if k in run.extensions),
    }


def test_root_projections(conform: Conform) -> None:
    conform(root_projections)


def subgraph_handles(impl: Impl) -> Any:
    run = _with_subgraph(impl).stream_events(START_VALUES, version="v3")
    handles = []
    for handle in run.subgraphs:
        handles.append((handle.path, handle.graph_name, list(handle.values), handle.status))
    lifecycle_run = _with_subgraph(impl).stream_events(START_VALUES, version="v3")
    return {
        "handles": handles,
        "output": run.output,
        "lifecycle": list(lifecycle_run.lifecycle),
    }


def test_subgraph_handles(conform: Conform) -> None:
    conform(subgraph_handles)


def errors_and_interrupts(impl: Impl) -> Any:
    failing = _with_subgraph(impl, fail="b")
    run = failing.stream_events(START_VALUES, version="v3")
    statuses = []
    try:
        for handle in run.subgraphs:
            statuses.append(handle.path)
    except ValueError as exc:
        statuses.append(_error(exc))
    out: Any = None
    try:
        out = failing.stream_events(START_VALUES, version="v3").output
    except ValueError as exc:
        out = _error(exc)

    def ask(state: State) -> dict[str, Any]:
        return {"value": impl.interrupt("name?")}

    b = impl.StateGraph(State)
    b.add_node("ask", ask)
    b.add_edge(impl.START, "ask")
    paused = impl.compile(b, checkpointer=impl.saver())
    config = {"configurable": {"thread_id": "v3-interrupt"}}
    run = paused.stream_events(START_VALUES, config, version="v3")
    resumed = paused.stream_events(impl.Command(resume="ada"), config, version="v3")
    return {
        "failing_handles": statuses,
        "failing_output": out,
        "interrupted": (run.output, run.interrupted, run.interrupts),
        "resumed": (resumed.output, resumed.interrupted),
    }


def test_errors_and_interrupts(conform: Conform) -> None:
    conform(errors_and_interrupts)


def chat_model_replies(impl: Impl) -> Any:
    model = GenericFakeChatModel(messages=iter(["streamed answer"]))

    def call_model(state: Any) -> dict[str, Any]:
        return {"messages": model.invoke(state["messages"])}

    def whole(state: Any) -> dict[str, Any]:
        return {"messages": AIMessage(content="hardcoded", id="msg-1")}

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("call_model", call_model)
    b.add_node("whole", whole)
    b.add_edge(impl.START, "call_model")
    b.add_edge("call_model", "whole")
    run = impl.compile(b).stream_events({"messages": "go"}, version="v3")
    replies = []
    for stream in run.messages:
        deltas = list(stream.text)
        replies.append((stream.node, "".join(deltas), len(deltas) > 1, stream.output.text))
    return {"replies": replies, "messages": [m.content for m in run.output["messages"]]}


def test_chat_model_replies(conform: Conform) -> None:
    conform(chat_model_replies)


def own_transformers(impl: Impl) -> Any:
    stream = impl.stream

    class ValuesCount(stream.StreamTransformer):
        required_stream_modes = ("values",)

        def __init__(self, scope: tuple[str, ...] = ()) -> None:
            super().__init__(scope)
            self.counts = stream.StreamChannel("counts")
            self.seen = 0

        def init(self) -> dict[str, Any]:
            return {"counts": self.counts}

        def process(self, event: Any) -> bool:
            if event["method"] == "values" and not event["params"]["namespace"]:
                self.seen += 1
                self.counts.push(self.seen)
            return True

    graph = impl.compile(_chain(impl, "a", "b"))
    run = graph.stream_events(START_VALUES, version="v3", transformers=[ValuesCount])
    counts = iter(run.extensions["counts"])
    events = [e["method"] for e in run]
    updates = graph.stream_events(
        START_VALUES, version="v3", transformers=[stream.UpdatesTransformer]
    )
    try:
        graph.stream_events(START_VALUES, version="v3", stream_mode="values")
    except TypeError as exc:
        refused: Any = type(exc).__name__
    return {
        "counts": list(counts),
        "events": events,
        "updates": list(updates.updates),
        "stream_mode": refused,
    }


def test_own_transformers(conform: Conform) -> None:
    conform(own_transformers)


def async_run(impl: Impl) -> Any:
    graph = _with_subgraph(impl)

    async def main() -> Any:
        run = await graph.astream_events(START_VALUES, version="v3")
        values = [v async for v in run.values]
        other = await graph.astream_events(START_VALUES, version="v3")
        handles = [(h.path, [v async for v in h.values]) async for h in other.subgraphs]
        return {"values": values, "output": await run.output(), "handles": handles}

    return asyncio.run(main())


def test_async_run(conform: Conform) -> None:
    conform(async_run)


def callback_events(impl: Impl) -> Any:
    """``astream_events(version="v2")``: LangChain's events of the graph, its nodes and
    the chat models they call (names, tags, nesting depth, LangGraph's metadata), each
    run's events in order (how two runs' events interleave is not compared: bulksync's run
    goes on while the caller reads its stream, LangGraph's waits for the reader)."""
    model = GenericFakeChatModel(messages=iter(["streamed answer"]))

    def call_model(state: Any) -> dict[str, Any]:
        return {"messages": model.invoke(state["messages"])}

    def done(state: Any) -> dict[str, Any]:
        return {"messages": AIMessage(content="done", id="msg-done")}

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("call_model", call_model)
    b.add_node("done", done)
    b.add_edge(impl.START, "call_model")
    b.add_edge("call_model", "done")
    graph = impl.compile(b)

    async def main() -> Any:
        seen = []
        async for e in graph.astream_events({"messages": "go"}, version="v2"):
            meta = e["metadata"]
            data = e["data"].get("chunk", e["data"].get("output"))
            shown = getattr(data, "content", None) if e["event"].startswith("on_chat") else data
            seen.append(
                (
                    e["event"],
                    e["name"],
                    e["tags"],
                    len(e["parent_ids"]),
                    meta.get("langgraph_node"),
                    meta.get("langgraph_step"),
                    meta.get("ls_integration"),
                    shown if e["event"] != "on_chain_stream" or e["parent_ids"] else None,
                )
            )
        by_run: dict[str, list[Any]] = {}
        for event in seen:
            by_run.setdefault(event[1], []).append(event)
        return list(by_run.values())

    return asyncio.run(main())


def test_callback_events(conform: Conform) -> None:
    conform(callback_events)


class _Tracer(BaseCallbackHandler):
    """A tracer as LangSmith's is: runs with their parents, names, tags, outputs, errors."""

    def __init__(self) -> None:
        self.depth: dict[Any, int] = {}
        self.runs: list[Any] = []

    def _start(self, kind: str, name: Any, kw: dict[str, Any]) -> None:
        run_id = kw["run_id"]
        self.depth[run_id] = self.depth.get(kw.get("parent_run_id"), -1) + 1
        self.runs.append(("start", kind, name, self.depth[run_id], kw.get("tags")))

    def on_chain_start(self, serialized: Any, inputs: Any, **kw: Any) -> None:
        self._start("chain", kw.get("name"), kw)

    def on_chat_model_start(self, serialized: Any, messages: Any, **kw: Any) -> None:
        self._start("chat_model", (serialized or {}).get("name"), kw)

    def on_tool_start(self, serialized: Any, input_str: Any, **kw: Any) -> None:
        self._start("tool", (serialized or {}).get("name"), kw)

    def on_chain_end(self, outputs: Any, *, run_id: Any, **kw: Any) -> None:
        self.runs.append(("end", "chain", self.depth[run_id], outputs))

    def on_llm_end(self, response: Any, *, run_id: Any, **kw: Any) -> None:
        self.runs.append(("end", "llm", self.depth[run_id], response.generations[0][0].text))

    def on_tool_end(self, output: Any, *, run_id: Any, **kw: Any) -> None:
        self.runs.append(("end", "tool", self.depth[run_id], output))

    def on_chain_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
        self.runs.append(("error", "chain", self.depth[run_id], type(error).__name__, str(error)))


def traced_invoke(impl: Impl) -> Any:
    """A tracer in ``invoke``'s callbacks hears the graph, each task, and the chat models
    and tools its nodes call (non-streaming: nothing in the config follows streams), and
    a node's failure; in each flavour, wherever the tasks run."""
    model = GenericFakeChatModel(messages=iter(["plain answer", "again"]))

    @tool
    def shout(text: str) -> str:
        """Say it louder."""
        return text.upper()

    def ask(state: Any) -> dict[str, Any]:
        reply = model.invoke(state["messages"])
        return {"messages": [reply, AIMessage(shout.invoke({"text": "hi"}), id="shout")]}

    def fail(state: Any) -> dict[str, Any]:
        raise ValueError("fail broke")

    b = impl.StateGraph(impl.MessagesState)
    b.add_node("ask", ask)
    b.add_edge(impl.START, "ask")
    tracer = _Tracer()
    answer = impl.compile(b).invoke({"messages": "go"}, {"callbacks": [tracer]})
    b.add_node("fail", fail)
    b.add_edge("ask", "fail")
    failing = _Tracer()
    try:
        impl.compile(b).invoke({"messages": "go"}, {"callbacks": [failing], "tags": ["mine"]})
    except ValueError as exc:
        raised = str(exc)
    return {"answer": answer, "runs": tracer.runs, "failing": failing.runs, "raised": raised}


def test_traced_invoke(conform: Conform) -> None:
    conform(traced_invoke)
