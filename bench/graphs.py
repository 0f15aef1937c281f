"""The graphs the benchmark runs, built by the same code on bulksync and on LangGraph.

``bulksync worker --graph bench.graphs`` loads this module's compiled graphs:

- ``fanout``: ``START`` sends ``Send("work", {"i": i})`` for ``i < n``; each ``work`` task
  returns ``{"out": [i]}``, concatenated by ``operator.add`` in Send order, so a correct run
  ends with ``out == list(range(n))``;
- ``loop``: one node ``tick`` adds 1 to ``i`` and loops on itself through a conditional edge
  until ``i == n``: ``n`` sequential supersteps with a tiny state;
- ``io_fanout`` and ``aio_fanout``: the fan-out of tasks that wait (``time.sleep`` in a sync
  node, ``asyncio.sleep`` in an async one), the shape of model and tool calls;
- ``cpu_fanout``: the same fan-out of tasks that compute for that long instead (CPU time of
  their thread), the shape of parsing, scoring or local models;
- ``line``: ``START`` → ``a`` → ``b`` → ``c`` → ``END``, each node adding its name to
  ``path``: one small run, end to end;
- ``chat``: one node ``say`` appends a 200-byte message to ``messages`` (``operator.add``)
  and loops until there are ``n``: a long conversation's growing history.

The module also defines the raw Celery baseline task, ``bench.raw_celery`` (one ``RPUSH`` per
task). ``bulksync worker`` imports only ``--graph`` modules and builds its Celery app after
importing them, so the task is declared with ``shared_task``: Celery adds a shared task to
every app of the process when that app is finalized, i.e. to the worker's own app when it
starts. The same worker processes therefore serve both the bulksync node tasks and the raw
baseline.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import operator
import os
import time
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypedDict

import redis
from celery import shared_task

from bulksync.graph import END, START, StateGraph
from bulksync.types import Send

RAW_TASK: Final = "bench.raw_celery"
"""The Celery task name of the raw baseline."""


@dataclass(frozen=True)
class Api:
    """The four names a graph is built from, taken from bulksync or from LangGraph."""

    StateGraph: Any
    Send: Any
    START: str
    END: str


BULKSYNC: Final = Api(StateGraph, Send, START, END)


def langgraph_api() -> Api:
    """The same names from LangGraph (imported only by the bench process and tests)."""
    from langgraph.graph import END as LG_END
    from langgraph.graph import START as LG_START
    from langgraph.graph import StateGraph as LGStateGraph
    from langgraph.types import Send as LGSend

    return Api(LGStateGraph, LGSend, LG_START, LG_END)


class FanoutState(TypedDict):
    """``n`` tasks to send; ``out`` gathers their indexes in Send order."""

    n: int
    out: Annotated[list[int], operator.add]


class Item(TypedDict):
    """What one ``Send`` hands to one ``work`` task."""

    i: int


class LoopState(TypedDict):
    """A counter ``i`` stepped up to ``n``."""

    i: int
    n: int


def work(item: Item) -> dict[str, Any]:
    """The trivial fan-out task: a tiny update naming its index."""
    return {"out": [item["i"]]}


def tick(state: LoopState) -> dict[str, Any]:
    """One sequential step."""
    return {"i": state["i"] + 1}


def fanout_builder(api: Api) -> Any:
    """``START`` → ``n`` Sends to ``work`` → ``END``, uncompiled."""

    def spread(state: FanoutState) -> list[Any]:
        return [api.Send("work", {"i": i}) for i in range(state["n"])]

    builder = api.StateGraph(FanoutState)
    builder.add_node("work", work)
    builder.add_conditional_edges(api.START, spread, ["work"])
    builder.add_edge("work", api.END)
    return builder


def loop_builder(api: Api) -> Any:
    """``START`` → ``tick`` ↺ until ``i == n`` → ``END``, uncompiled."""

    def again(state: LoopState) -> str:
        return "tick" if state["i"] < state["n"] else api.END

    builder = api.StateGraph(LoopState)
    builder.add_node("tick", tick)
    builder.add_edge(api.START, "tick")
    builder.add_conditional_edges("tick", again, ["tick", api.END])
    return builder


def fanout_input(n: int) -> dict[str, Any]:
    """The fan-out graph's input for ``n`` tasks."""
    return {"n": n, "out": []}


def loop_input(steps: int) -> dict[str, Any]:
    """The loop graph's input for ``steps`` sequential steps."""
    return {"i": 0, "n": steps}


def loop_config(steps: int, thread_id: str | None = None) -> dict[str, Any]:
    """A config whose recursion limit lets ``steps`` steps run (LangGraph's default is 25)."""
    config: dict[str, Any] = {"recursion_limit": steps + 5}
    if thread_id is not None:
        config["configurable"] = {"thread_id": thread_id}
    return config


class WaitState(TypedDict):
    """``n`` tasks that each wait ``wait`` seconds; ``out`` gathers their indexes."""

    n: int
    wait: float
    out: Annotated[list[int], operator.add]


class WaitItem(TypedDict):
    """What one ``Send`` hands to one waiting task."""

    i: int
    wait: float


def wait(item: WaitItem) -> dict[str, Any]:
    """An IO-bound task as a tool or model call is: it waits (blocking), then answers."""
    time.sleep(item["wait"])
    return {"out": [item["i"]]}


async def await_(item: WaitItem) -> dict[str, Any]:
    """The same as an async node: it awaits, then answers."""
    await asyncio.sleep(item["wait"])
    return {"out": [item["i"]]}


def burn(item: WaitItem) -> dict[str, Any]:
    """A CPU-bound task: it computes until its thread has used ``wait`` seconds of CPU."""
    until = time.thread_time() + item["wait"]
    digest = b"%d" % item["i"]
    while time.thread_time() < until:
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()
    return {"out": [item["i"]]}


def waiting_builder(api: Api, node: Any) -> Any:
    """``START`` → ``n`` Sends to ``node`` (``wait`` or ``await_``) → ``END``, uncompiled."""

    def spread(state: WaitState) -> list[Any]:
        return [api.Send("work", {"i": i, "wait": state["wait"]}) for i in range(state["n"])]

    builder = api.StateGraph(WaitState)
    builder.add_node("work", node)
    builder.add_conditional_edges(api.START, spread, ["work"])
    builder.add_edge("work", api.END)
    return builder


def waiting_input(n: int, seconds: float) -> dict[str, Any]:
    """The waiting fan-out's input: ``n`` tasks of ``seconds`` each."""
    return {"n": n, "wait": seconds, "out": []}


class LineState(TypedDict):
    """The nodes a run went through, in order."""

    path: Annotated[list[str], operator.add]


LINE_INPUT: Final = {"path": []}
LINE_OUTPUT: Final = {"path": ["a", "b", "c"]}


def a(state: LineState) -> dict[str, Any]:
    """The first of three trivial nodes."""
    return {"path": ["a"]}


def b(state: LineState) -> dict[str, Any]:
    """The second."""
    return {"path": ["b"]}


def c(state: LineState) -> dict[str, Any]:
    """The third."""
    return {"path": ["c"]}


def line_builder(api: Api) -> Any:
    """``START`` → ``a`` → ``b`` → ``c`` → ``END``, uncompiled."""
    builder = api.StateGraph(LineState)
    for node in (a, b, c):
        builder.add_node(node.__name__, node)
    builder.add_edge(api.START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", api.END)
    return builder


class ChatState(TypedDict):
    """A conversation: its messages, and how many it runs to."""

    messages: Annotated[list[str], operator.add]
    n: int


MESSAGE_BYTES: Final = 200


def say(state: ChatState) -> dict[str, Any]:
    """One turn: a message of ``MESSAGE_BYTES`` bytes, numbered, as little compressible as
    text is (Postgres compresses large values: repeated bytes would flatter whole lists)."""
    turn = len(state["messages"])
    text = base64.b64encode(hashlib.sha512(str(turn).encode()).digest() * 3).decode()
    return {"messages": [f"{turn}:{text}"[:MESSAGE_BYTES]]}


def chat_builder(api: Api) -> Any:
    """``START`` → ``say`` ↺ until ``n`` messages → ``END``, uncompiled."""

    def more(state: ChatState) -> str:
        return "say" if len(state["messages"]) < state["n"] else api.END

    builder = api.StateGraph(ChatState)
    builder.add_node("say", say)
    builder.add_edge(api.START, "say")
    builder.add_conditional_edges("say", more, ["say", api.END])
    return builder


fanout = fanout_builder(BULKSYNC).compile()
loop = loop_builder(BULKSYNC).compile()
io_fanout = waiting_builder(BULKSYNC, wait).compile()
aio_fanout = waiting_builder(BULKSYNC, await_).compile()
cpu_fanout = waiting_builder(BULKSYNC, burn).compile()
line = line_builder(BULKSYNC).compile()
chat = chat_builder(BULKSYNC).compile()

_clients: dict[int, redis.Redis] = {}


@shared_task(name=RAW_TASK, ignore_result=True)
def raw_celery(redis_url: str, key: str, i: int) -> None:
    """The raw baseline's trivial task: report ``i`` by ``RPUSH`` to ``key``."""
    client = _clients.get(os.getpid())
    if client is None:  # one client per process, as bulksync workers keep
        client = _clients[os.getpid()] = redis.Redis.from_url(redis_url)
    client.rpush(key, i)
