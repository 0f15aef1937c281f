"""Names shared by the graph builder, the pure core and the executors.

These strings are part of the stored format (they appear in checkpoints and pending
writes) and match LangGraph's, so a thread's history reads the same in both.
"""

from __future__ import annotations

from typing import Final

START: Final = "__start__"
"""The virtual first node; its channel receives the graph input."""
END: Final = "__end__"
"""The virtual last node; an edge to it ends a branch."""

# Reserved channels: control data, never applied as state.
TASKS: Final = "__pregel_tasks"  # Topic of pending Sends, one PUSH task per entry
INTERRUPT: Final = "__interrupt__"
RESUME: Final = "__resume__"
ERROR: Final = "__error__"
NO_WRITES: Final = "__no_writes__"
RETURN: Final = "__return__"
ERROR_SOURCE_NODE: Final = "__error_source_node__"
NODE_ERROR: Final = "__node_error__"  # a node failed for good: its handler runs on resume
PREVIOUS: Final = "__previous__"  # an entrypoint's saved value, its next run's ``previous``
CONTROL_CHANNELS: Final = frozenset(
    {NO_WRITES, "__pregel_push", RESUME, INTERRUPT, RETURN, ERROR, ERROR_SOURCE_NODE, NODE_ERROR}
)

PUSH: Final = "__pregel_push"
PULL: Final = "__pregel_pull"
NS_SEP: Final = "|"
NS_END: Final = ":"
NULL_TASK_ID: Final = "00000000-0000-0000-0000-000000000000"

# Fixed slots of special writes in a task's pending writes (regular writes use their index).
WRITES_IDX_MAP: Final = {
    ERROR: -1,
    "__scheduled__": -2,
    INTERRUPT: -3,
    RESUME: -4,
    NODE_ERROR: -5,
}

DEFAULT_RECURSION_LIMIT: Final = 10007
CHECKPOINT_VERSION: Final = 4

# Keys of ``config["configurable"]`` that users set.
THREAD_ID: Final = "thread_id"
CHECKPOINT_NS: Final = "checkpoint_ns"
CHECKPOINT_ID: Final = "checkpoint_id"

# Set by ``stream_events(version="v3")`` in a run's ``configurable``: its tasks stream chat
# models as LangChain's content-block events (``ChatModelStream``), not v1 token chunks.
MESSAGE_EVENTS: Final = "__bulksync_message_events"

# The namespace prefix of node results in a node cache (``bulksync.cache``), LangGraph's.
CACHE_NS_WRITES: Final = "__pregel_ns_writes"

# Set in a run's ``configurable`` when an async caller (``ainvoke``, ``astream``) started it:
# a Runnable node with an async side of its own is called through it, in-process and on
# workers alike, as LangGraph calls it there. Never inherited by a run started inside.
ASYNC_CALLER: Final = "__bulksync_async_caller"

# Names a user may not give a node or a state key.
RESERVED: Final = frozenset(
    {START, END, TASKS, INTERRUPT, RESUME, ERROR, NO_WRITES, RETURN, PUSH, PULL, NODE_ERROR}
)
