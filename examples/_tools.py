"""Offline tools several examples give their agents: arithmetic and a tiny encyclopedia.

They answer from this file alone (no network), so an example gives the same answer on every
machine; a real model (``BULKSYNC_EXAMPLE_MODEL``, see ``examples/_models.py``) calls them as
it would any LangChain tool.
"""

from __future__ import annotations

from langchain_core.tools import tool

FACTS = {
    "pregel": "Pregel is Google's bulk-synchronous graph system (Malewicz et al., 2010).",
    "celery": "Celery is a distributed task queue for Python, first released in 2009.",
}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
def search(query: str) -> str:
    """Look a topic up in the (tiny, offline) encyclopedia."""
    hits = [fact for topic, fact in FACTS.items() if topic in query.lower()]
    return " ".join(hits) or f"Nothing found about {query!r}."
