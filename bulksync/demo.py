"""The map-reduce fan-out graph behind ``bulksync demo`` and ``examples/map_reduce.py``.

``split`` turns a list of topics into ``fanout`` subjects; a conditional edge sends one
``Send("generate", {"subject": …})`` per subject, so ``generate`` runs as that many PUSH tasks
in one superstep; their ``jokes`` lists are concatenated by the ``operator.add`` reducer in
Send order; ``summarize`` then runs once and picks the best joke. Everything is deterministic
(no model is called), so two runs of the same input give the same state.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated, Any, Final, TypedDict

from bulksync.errors import ConfigError
from bulksync.graph import END, START, StateGraph
from bulksync.types import Send

DEFAULT_TOPICS: Final = (
    "cats",
    "compilers",
    "coffee",
    "penguins",
    "quantum physics",
    "tax returns",
    "sourdough",
    "distributed systems",
)

# Punchlines are picked by the subject's length, so the output varies but never at random.
PUNCHLINES: Final = (
    "it kept waiting for the next superstep",
    "nobody could agree which checkpoint came first",
    "it fanned out and never came back",
    "the reducer added it twice, then once",
)


class JokeState(TypedDict, total=False):
    """The demo graph's state; ``jokes`` gathers every ``generate`` task's output."""

    topics: list[str]
    fanout: int
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]
    best_joke: str
    summary: str


class JokeTask(TypedDict):
    """What one ``Send`` hands to one ``generate`` task."""

    subject: str


def make_subjects(topics: Sequence[str], fanout: int) -> list[str]:
    """``fanout`` subjects drawn from ``topics`` in order, numbered once the list wraps.

    Raises:
        ConfigError: when ``topics`` is empty or ``fanout`` is below 1 (a ``ValueError``).
    """
    if not topics:
        raise ConfigError("the demo needs at least one topic; pass a non-empty 'topics' list")
    if fanout < 1:
        raise ConfigError(f"fanout must be at least 1, got {fanout}; pass a fanout of 1 or more")
    subjects = []
    for i in range(fanout):
        lap, index = divmod(i, len(topics))
        subjects.append(topics[index] if lap == 0 else f"{topics[index]} #{lap + 1}")
    return subjects


def split(state: JokeState) -> dict[str, Any]:
    """Map step, part 1: decide the subjects to fan out over."""
    topics = state.get("topics") or list(DEFAULT_TOPICS)
    return {"subjects": make_subjects(topics, state.get("fanout", len(topics)))}


def fan_out(state: JokeState) -> list[Send]:
    """Map step, part 2: one ``generate`` task per subject."""
    return [Send("generate", JokeTask(subject=s)) for s in state["subjects"]]


def generate(task: JokeTask) -> dict[str, Any]:
    """The mapped task: one joke about one subject."""
    subject = task["subject"]
    punchline = PUNCHLINES[len(subject) % len(PUNCHLINES)]
    return {"jokes": [f"Why did {subject} join the cluster? Because {punchline}."]}


def summarize(state: JokeState) -> dict[str, Any]:
    """Reduce step: pick the longest joke (the first one on a tie) and count them."""
    jokes = state.get("jokes", [])
    best = max(jokes, key=len, default="")
    return {"best_joke": best, "summary": f"{len(jokes)} jokes, one per subject"}


def build_demo_graph() -> StateGraph[JokeState]:
    """The uncompiled map-reduce graph; compile it with the checkpointer of your choice."""
    builder: StateGraph[JokeState] = StateGraph(JokeState)
    builder.add_node("split", split)
    builder.add_node("generate", generate)
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "split")
    builder.add_conditional_edges("split", fan_out, ["generate"])
    builder.add_edge("generate", "summarize")
    builder.add_edge("summarize", END)
    return builder


def demo_input(fanout: int, topics: Sequence[str] = DEFAULT_TOPICS) -> JokeState:
    """The input ``bulksync demo`` starts a run with."""
    return JokeState(topics=list(topics), fanout=fanout)


graph = build_demo_graph().compile()
"""The demo graph compiled without a checkpointer: ``bulksync worker --graph bulksync.demo``
and ``bulksync coordinator --graph bulksync.demo`` serve it as ``bulksync.demo:graph`` (the
coordinator gives it its Postgres checkpointer)."""
