"""Running one node task: the same code in a thread of this process or on a cluster worker.

``run_task`` rebuilds what the node may read (the step's channels), runs the node with its
retry policy inside a ``TaskContext`` (so ``interrupt``, ``get_config`` and
``get_stream_writer`` work), turns its output into writes with the node's writer, and
returns a ``TaskResult``. It never raises: errors and interrupts are part of the result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from bulksync.checkpoint.base import decoded
from bulksync.constants import (
    CHECKPOINT_NS,
    MESSAGE_EVENTS,
    NODE_ERROR,
    NS_SEP,
    PREVIOUS,
    RESUME,
    START,
)
from bulksync.context import NullResume, Scratchpad, TaskContext, task_context
from bulksync.coordinator.executor import CallRecord, StepInput, StepLive, TaskResult
from bulksync.coordinator.plan import Task
from bulksync.coordinator.reader import StateReader, apply_parent_command
from bulksync.coordinator.spec import GraphSpec, NodeSpec, Write
from bulksync.errors import (
    GraphInterrupt,
    NodeCancelledError,
    NodeError,
    ParentCommand,
    TaskCancelledError,
)
from bulksync.ids import interrupt_id
from bulksync.managed import managed_values
from bulksync.runtime import ExecutionInfo, Runtime, ServerInfo
from bulksync.workers.calls import CallLog, Calls, LazyCalls
from bulksync.workers.cancel_scope import current_scope, run_coroutine
from bulksync.workers.messages import MessageStream, listening, message_stream
from bulksync.workers.timeouts import AttemptClock, progress_handler, run_timed
from bulksync.workers.tool_events import tool_events
from bulksync.workers.tracing import TracedRun, with_handlers

LANGGRAPH_RUNTIME_KEY = "__pregel_runtime"
"""The ``configurable`` key under which LangGraph's runnables find the task's ``Runtime``."""


def task_config(step: StepInput, task: Task) -> dict[str, Any]:
    """The config a node sees: the run's, with the task's namespace and metadata.

    Not the run's ``run_id``: it names the run, once. A node handing its config to a chat
    model would give every model call that id, and so every answer the same message id
    (``lc_run--<run id>-0``), which ``add_messages`` then merges into one.
    """
    config = {k: v for k, v in step.config.items() if k != "run_id"}
    config["metadata"] = {**(step.config.get("metadata") or {}), **task.metadata()}
    config["configurable"] = {
        **(step.config.get("configurable") or {}),
        CHECKPOINT_NS: task.checkpoint_ns,
    }
    return config


def resume_answers(task: Task, step: StepInput) -> list[Any]:
    """Answers the task already has, plus the one a resume map gives its next interrupt."""
    answers = list(step.resume.get(task.id, ()))
    if step.resume_map:
        next_id = interrupt_id(task.checkpoint_ns, len(answers))
        first_id = interrupt_id(task.checkpoint_ns, 0)
        if next_id in step.resume_map:
            answers.append(step.resume_map[next_id])
        elif first_id in step.resume_map:
            answers.append(step.resume_map[first_id])
    return answers


@dataclasses.dataclass(frozen=True, slots=True)
class _Wait:
    """What a task's steps (``_task_steps``) wait for: a coroutine to run to its end (an
    async node's), or a call that blocks (joining threads, a retry's backoff)."""

    awaitable: Awaitable[Any] | None = None
    call: Callable[[], Any] | None = None
    ready: Callable[[], bool] | None = None
    """True when ``call`` would return at once: then it is made here, on no thread."""

    def block(self) -> Any:
        """Wait on this thread: the coroutine on the caller scope's loop or one of its own."""
        if self.awaitable is not None:
            return run_coroutine(self.awaitable)
        assert self.call is not None
        return self.call()

    async def wait(self) -> Any:
        """Wait on the running loop: the coroutine here, under the caller's cancel scope;
        what blocks on a thread."""
        if self.awaitable is not None:
            scope = current_scope()
            return await (self.awaitable if scope is None else scope.track(self.awaitable))
        assert self.call is not None
        if self.ready is not None and self.ready():
            return self.call()
        return await asyncio.to_thread(self.call)


_Steps = Generator[_Wait, Any, TaskResult]


def _joined(calls: LazyCalls) -> _Wait:
    """Waiting for a task's ``@task`` calls to end: on a thread only while some still run
    (an async node's task waits on its event loop)."""
    return _Wait(call=calls.join, ready=calls.ended)


def _attempt(
    node: NodeSpec,
    task: Task,
    ctx: TaskContext,
    read: StateReader,
    messages: MessageStream | None,
    traced: TracedRun | None,
    clock: AttemptClock | None,
) -> Generator[_Wait, Any, list[Write]]:
    with task_context(ctx), listening(ctx.config):
        try:
            assert node.run is not None, f"node '{node.name}' is a subgraph; the loop runs it"
            output = node.run(task.input)
            if inspect.isawaitable(output):  # an async node: run by the driver, timed
                timed = output if clock is None else run_timed(output, clock, node.name)
                output = yield _Wait(awaitable=timed)
            if messages is not None:
                messages.node_output(output)
            writes = node.writer(output, read)
        except ParentCommand as exc:
            if traced is not None:
                traced.error(exc)
            return apply_parent_command(node, task, exc, read)
        except BaseException as exc:
            if traced is not None:
                traced.error(exc)
            raise
        if traced is not None:
            traced.streamed(output)
            traced.end(output)
        return writes


def _task_callbacks(
    config: dict[str, Any], task: Task, handlers: list[Any]
) -> tuple[Any, TracedRun | None]:
    """The callbacks a task's node gets — the run's and the task's stream handlers, under
    a chain run of its own when the run has LangChain callbacks (``tracing.py``) — and that
    run."""
    traced = None
    if task.name != START:  # the input's own step is bookkeeping, not a node (as in LangGraph)
        tags = (f"graph:step:{task.step}",)
        traced = TracedRun.start(config, task.name, task.input, tags=tags, extra=handlers)
    if traced is not None:
        # LangGraph runs a node as a sequence whose first step is the node's function.
        return traced.child("seq:step:1"), traced
    # Chat models and tools the node hands its config to report to the handlers.
    return with_handlers(config.get("callbacks"), handlers), None


def run_task(spec: GraphSpec, task: Task, step: StepInput, live: StepLive) -> TaskResult:
    """Run ``task`` of ``spec`` to a result (writes, error or interrupts); never raises.

    A node that fails for good has its error handler run in its place. When the step says
    the task's node failed already (``StepInput.node_errors``), only its handler runs. An
    async node's coroutine runs on the caller scope's loop or one of its own, while this
    thread waits (``cancel_scope.run_coroutine``).
    """
    steps = _task_steps(spec, task, step, live)
    got = _advance(steps, None, None)
    while isinstance(got, _Wait):
        try:
            answer, error = got.block(), None
        except BaseException as exc:  # the node's own error: the steps handle it
            answer, error = None, exc
        got = _advance(steps, answer, error)
    return got


async def arun_task(spec: GraphSpec, task: Task, step: StepInput, live: StepLive) -> TaskResult:
    """``run_task`` on an event loop: an async node's coroutine is awaited here (no thread
    waits for it; the caller's cancel scope can cancel it), what blocks runs on a thread."""
    steps = _task_steps(spec, task, step, live)
    got = _advance(steps, None, None)
    while isinstance(got, _Wait):
        try:
            answer, error = await got.wait(), None
        except BaseException as exc:  # the node's own error: the steps handle it
            answer, error = None, exc
        got = _advance(steps, answer, error)
    return got


def _advance(steps: _Steps, answer: Any, error: BaseException | None) -> _Wait | TaskResult:
    """Resume ``steps`` with what it waited for (or its error); what it waits for next, or
    the task's result."""
    try:
        return steps.send(answer) if error is None else steps.throw(error)
    except StopIteration as done:
        result: TaskResult = done.value
        return result


def _task_steps(spec: GraphSpec, task: Task, step: StepInput, live: StepLive) -> _Steps:
    """``run_task``'s work, yielding what it waits for to the driver (sync or async)."""
    node = spec.nodes[task.name]
    read = StateReader(spec, step, managed_values(spec.managed, task.step, step.stop))
    # The task's own level over the step's answer: it records whether this task took it.
    null_resume = NullResume(None, live.null_resume)
    messages = _message_stream(step, task, live)
    handlers = _handlers(step, live, messages)
    node_error = _recorded_failure(step, task)
    handled_by = ""
    if node_error is not None and node.error_handler is not None:
        handled_by = node.error_handler.name
        node = _handler_in_place(node)
    first_attempt = time.time()
    attempt = 0
    while True:
        attempt += 1
        timeout = task.timeout or node.timeout  # a Send's own, else its node's
        clock = AttemptClock(timeout) if timeout is not None else None
        ctx, resumes, calls, traced = _prepare_attempt(
            step, live, task, null_resume, (attempt, first_attempt), clock, handlers, messages
        )
        ctx.node_error = node_error
        try:
            writes = yield from _attempt(node, task, ctx, read, messages, traced, clock)
            return TaskResult(
                task.id,
                tuple(_sent(resumes) + writes),
                took_null_resume=null_resume.taken,
                calls=(yield _joined(calls)),
                handled_by=handled_by,
            )
        except GraphInterrupt as exc:
            return TaskResult(
                task.id,
                tuple(_last_resume(resumes)),
                interrupts=exc.interrupts,
                interrupted=True,
                took_null_resume=null_resume.taken,
                calls=(yield _joined(calls)),
            )
        except ParentCommand as exc:
            return TaskResult(task.id, (), error=exc, took_null_resume=null_resume.taken)
        except asyncio.CancelledError as exc:
            scope = current_scope()
            if scope is not None and scope.cancelled:  # its step was cancelled: no result
                return TaskResult(task.id, error=TaskCancelledError(task.id))
            # Raised by the node's own code (nothing cancelled it): a failure of the node.
            error = NodeCancelledError(task.name)
            error.__cause__ = exc
            return _failed(task, error, null_resume, (yield _joined(calls)))
        except Exception as exc:
            done = yield _joined(calls)  # the failed attempt's calls end before anything
            policy = next((p for p in node.retry_policy if p.should_retry(exc)), None)
            if policy is not None and attempt < policy.max_attempts:
                yield _Wait(call=functools.partial(time.sleep, policy.delay(attempt)))  # backoff
                continue
            # The error keeps its type; the note (LangGraph's words) names node and task.
            exc.add_note(f"During task with name '{task.name}' and id '{task.id}'")
            handler = node.error_handler
            if handler is None:
                # A crashed handler: the node's failure is kept, so that a resumed run runs
                # the handler again, not the node.
                kept = () if node_error is None else (_failure_write(node_error),)
                return _failed(task, exc, null_resume, done, kept)
            # Failed for good: the node's error handler runs in its place, with its own
            # retries; its update or Command is written as the node's.
            node_error, handled_by, attempt = NodeError(node.name, exc), handler.name, 0
            node = _handler_in_place(node)


def _prepare_attempt(
    step: StepInput,
    live: StepLive,
    task: Task,
    null_resume: NullResume,
    attempt: tuple[int, float],
    clock: AttemptClock | None,
    handlers: list[Any],
    messages: MessageStream | None,
) -> tuple[TaskContext, list[Write], LazyCalls, TracedRun | None]:
    """One attempt's context (its callbacks, ``@task`` calls and message stream set), the
    list its resume answers are sent to, its calls (joined when the attempt ends) and its
    traced run (None without LangChain callbacks)."""
    resumes: list[Write] = []
    ctx = _attempt_context(step, live, task, resumes, null_resume, attempt, clock)
    callbacks, traced = _task_callbacks(ctx.config, task, _timed(handlers, clock))
    if callbacks is not None:
        ctx.config["callbacks"] = callbacks
    ctx.call_starter = calls = LazyCalls(
        functools.partial(_calls, step, live, task, null_resume, handlers, clock)
    )
    ctx.messages = messages
    return ctx, resumes, calls, traced


def _failed(
    task: Task,
    error: BaseException,
    null_resume: NullResume,
    calls: tuple[CallRecord, ...],
    kept: tuple[Write, ...] = (),
) -> TaskResult:
    """A failed task's result: the ``calls`` it made that finished are kept all the same,
    and ``kept`` writes (a node failure its crashed handler leaves for a resumed run)."""
    return TaskResult(task.id, kept, error=error, took_null_resume=null_resume.taken, calls=calls)


def _handler_in_place(node: NodeSpec) -> NodeSpec:
    """``node`` running its error handler instead of itself (with the handler's retries)."""
    handler = node.error_handler
    assert handler is not None, f"node '{node.name}' has no error handler"
    return dataclasses.replace(
        node,
        run=handler.run,
        writer=handler.writer,
        retry_policy=handler.retry_policy,
        error_handler=None,
        timeout=None,
        subgraph=None,
    )


def _failure_write(error: NodeError) -> Write:
    """The write recording that a node failed for good, for its handler to run on resume."""
    return (NODE_ERROR, [error.node, error.error])


def _recorded_failure(step: StepInput, task: Task) -> NodeError | None:
    """The failure recorded for ``task`` in this step before (by ``_failure_write``)."""
    recorded = step.node_errors.get(task.id)
    if recorded is None:
        return None
    node, error = recorded
    return NodeError(node, error)


def _attempt_context(
    step: StepInput,
    live: StepLive,
    task: Task,
    resumes: list[Write],
    null_resume: NullResume,
    attempt: tuple[int, float],
    clock: AttemptClock | None = None,
) -> TaskContext:
    """The context one attempt of ``task`` (a node's, or a ``@task`` call's) runs in; a
    timed attempt's stream writes and heartbeats are its ``clock``'s progress."""
    pad = Scratchpad(
        task_ns=task.checkpoint_ns,
        step=task.step,
        stop=step.stop,
        resume=resume_answers(task, step),
        null_resume=null_resume,
    )
    config = task_config(step, task)
    writer: Callable[[Any], None] = functools.partial(live.sink, step.namespace, "custom")
    if clock is not None:
        writer = clock.guard(writer)
    runtime = _runtime(step, task, config, writer, *attempt, live=live)
    if clock is not None:
        runtime = runtime.override(heartbeat=clock.heartbeat)
    # Where LangGraph's own runnables used as nodes (langgraph.prebuilt's ToolNode, …) look
    # for the runtime they inject into tools: a name of LangGraph's config, read, not shipped.
    config["configurable"][LANGGRAPH_RUNTIME_KEY] = runtime
    return TaskContext(
        config=config,
        scratchpad=pad,
        stream_writer=writer,
        send=resumes.extend,
        parent=(step, live, task) if step.nesting is not None else None,
        runtime=runtime,
    )


def _calls(
    step: StepInput,
    live: StepLive,
    task: Task,
    null_resume: NullResume,
    handlers: list[Any],
    clock: AttemptClock | None,
) -> Calls:
    """What starts ``task``'s ``@task`` calls: each in a context of its own, sharing the
    task's level of the run-wide resume answer (a call that takes it, the task took) and
    its stream handlers (a tool called in a call streams as one called in the node). A call
    started is progress of the task's timed attempt (``clock``)."""
    modes = step.nesting.modes if step.nesting is not None else ("updates",)

    def context_for(call: Task, resumes: list[Write], timed: AttemptClock | None) -> TaskContext:
        own = NullResume(None, null_resume)
        ctx = _attempt_context(step, live, call, resumes, own, (1, time.time()), timed)
        call_handlers = _timed(handlers, timed)
        if call_handlers:
            ctx.config["callbacks"] = with_handlers(ctx.config.get("callbacks"), call_handlers)
        return ctx

    def emit(update: dict[str, Any]) -> None:
        if "updates" in modes:
            live.sink(step.namespace, "updates", update)

    started = clock.progress if clock is not None else None
    return Calls(task, step.returns, context_for, CallLog(), emit, started, live.cache)


def _timed(handlers: list[Any], clock: AttemptClock | None) -> list[Any]:
    """``handlers``, plus the one that counts callback events as a timed attempt's progress."""
    handler = progress_handler(clock) if clock is not None else None
    return handlers if handler is None else [*handlers, handler]


def _runtime(
    step: StepInput,
    task: Task,
    config: dict[str, Any],
    writer: Callable[[Any], None],
    attempt: int,
    first_attempt: float,
    *,
    live: StepLive,
) -> Runtime[Any]:
    """What ``runtime``/``get_runtime()`` give the node in this attempt."""
    configurable = config.get("configurable") or {}
    checkpoints = step.nesting.checkpoint_map if step.nesting is not None else {}
    info = ExecutionInfo(
        checkpoint_id=str(checkpoints.get(_parent_ns(task.checkpoint_ns), "")),
        checkpoint_ns=task.checkpoint_ns,
        task_id=task.id,
        thread_id=configurable.get("thread_id"),
        run_id=None if step.config.get("run_id") is None else str(step.config["run_id"]),
        node_attempt=attempt,
        node_first_attempt_time=first_attempt,
    )
    previous = step.channel_values.get(PREVIOUS)  # an entrypoint's saved value, if any
    return Runtime(
        context=step.context,
        store=live.store,
        control=live.control,
        stream_writer=writer,
        previous=None if previous is None else decoded(previous),
        execution_info=info,
        server_info=ServerInfo.of(configurable),
    )


def _parent_ns(task_ns: str) -> str:
    """The namespace of the graph a task belongs to (its own segment dropped)."""
    return task_ns.rpartition(NS_SEP)[0] if NS_SEP in task_ns else ""


def _message_stream(step: StepInput, task: Task, live: StepLive) -> MessageStream | None:
    """The task's ``messages`` stream, when its run asks for that mode (see messages.py)."""
    modes = step.nesting.modes if step.nesting is not None else ()
    if "messages" not in modes:  # the common case: nothing to set up per task
        return None
    if task.name == START:  # the input's own step: hidden, as LangGraph hides it
        return None

    def emit(message: Any, metadata: dict[str, Any]) -> None:
        live.sink(step.namespace, "messages", (message, metadata))

    config = task_config(step, task)
    events = config["configurable"].get(MESSAGE_EVENTS) is not None
    stream = message_stream(modes, emit, config["metadata"], events=events)
    if stream is not None:
        stream.saw_input(task.input)
    return stream


def _handlers(step: StepInput, live: StepLive, messages: MessageStream | None) -> list[Any]:
    """The LangChain callback handlers of the stream modes the run asks for."""
    modes = step.nesting.modes if step.nesting is not None else ()
    tools = tool_events(modes, functools.partial(live.sink, step.namespace, "tools"))
    return [h for h in (messages.handler if messages else None, tools) if h is not None]


def _last_resume(resumes: list[Write]) -> list[Write]:
    """Only the latest ``__resume__`` write counts: it lists every answer consumed."""
    last = [w for w in resumes if w[0] == RESUME][-1:]
    return [(RESUME, w[1]) for w in last]


def _sent(sent: list[Write]) -> list[Write]:
    """What a finished node sent while it ran: its latest ``__resume__`` write, then the
    others (``push_message``'s) in the order sent."""
    return _last_resume(sent) + [w for w in sent if w[0] != RESUME]


__all__ = ["arun_task", "run_task"]
