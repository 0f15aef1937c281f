"""What a running node can reach: its config, stream writer and interrupt scratchpad.

The engine sets one ``TaskContext`` per task attempt in a context variable; ``interrupt``,
``get_config``, ``get_stream_writer`` and a graph invoked inside a node read it from there.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "bulksync_task", default=None
)


@dataclasses.dataclass(slots=True)
class Scratchpad:
    """Per-attempt interrupt bookkeeping of one task.

    ``resume`` holds the answers this task already received, in call order;
    ``null_resume`` is the run-wide ``Command(resume=v)`` value, consumed once.
    """

    task_ns: str
    step: int
    stop: int
    resume: list[Any]
    null_resume: NullResume
    counter: Iterator[int] = dataclasses.field(default_factory=itertools.count)
    subgraph_counter: Iterator[int] = dataclasses.field(default_factory=itertools.count)

    def next_interrupt_index(self) -> int:
        """Index of the next ``interrupt()`` call in this attempt."""
        return next(self.counter)

    def take_null_resume(self) -> Any:
        """The run-wide resume value, once; ``None`` when there is none (left)."""
        return self.null_resume.take()


class NullResume:
    """A run-wide ``Command(resume=v)`` answer that exactly one interrupt may consume."""

    def __init__(self, value: Any = None, parent: NullResume | None = None) -> None:
        # Tasks on several threads may race to take the value: a deque's popleft is
        # atomic, so exactly one gets it, without a lock (this module is imported by
        # ``types``, which the pure core uses, so it stays free of ``threading``).
        self._value: collections.deque[Any] = collections.deque(
            () if value is None else (value,), maxlen=1
        )
        self._parent = parent
        self.taken = False
        """Whether ``take`` ever returned a value through this level (its own or a parent's):
        a task's own level tells the coordinator that the task consumed the answer."""

    def take(self) -> Any:
        """Consume and return the value (or the parent's); ``None`` when none is left."""
        try:
            value = self._value.popleft()
        except IndexError:
            value = self._parent.take() if self._parent is not None else None
        if value is not None:
            self.taken = True
        return value

    def peek(self) -> Any:
        """The value without consuming it."""
        if self._value:
            return self._value[0]
        return self._parent.peek() if self._parent is not None else None


@dataclasses.dataclass(slots=True)
class TaskContext:
    """The running task as its node sees it."""

    config: dict[str, Any]
    scratchpad: Scratchpad
    stream_writer: Callable[[Any], None]
    send: Callable[[list[tuple[str, Any]]], None]
    # Set when the engine runs this task: lets a graph invoked inside the node nest
    # under it (inherit the saver, namespace, streams and resume state).
    parent: Any = None
    # The task's ``runtime.Runtime`` (context, stream writer, execution info).
    runtime: Any = None
    # Gives what starts the task's ``@task`` calls (``workers.calls.LazyCalls``: built at
    # the first call, as most nodes make none).
    call_starter: Callable[[], Any] | None = None
    # In a node's error handler: the ``errors.NodeError`` it handles.
    node_error: Any = None
    # The task's ``messages`` stream (``workers.messages.MessageStream``) when its run has one.
    messages: Any = None

    @property
    def calls(self) -> Any:
        """What starts the task's ``@task`` calls (``workers.calls.Calls``); None where no
        call can be made."""
        return None if self.call_starter is None else self.call_starter()

    def record_resume(self, answers: list[Any]) -> None:
        """Record the answers consumed so far as the task's ``__resume__`` write."""
        from bulksync.constants import RESUME

        self.send([(RESUME, list(answers))])


def current_task() -> TaskContext:
    """The task running in this thread or coroutine.

    Raises:
        RuntimeError: outside a node run by bulksync.
    """
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "Called outside a running graph node: interrupt(), get_config() and "
            "get_stream_writer() work only inside a node that bulksync is executing."
        )
    return ctx


def maybe_current_task() -> TaskContext | None:
    """The running task, or ``None`` outside one."""
    return _current.get()


@contextmanager
def task_context(ctx: TaskContext) -> Iterator[TaskContext]:
    """Make ``ctx`` the current task for the duration of the block."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
