"""The Celery side of a node task: read the step by reference, run, record the first result.

One Celery message carries one or more tasks of one node (small Send tasks are batched),
as ``[graph id, subgraph path, step key, run id, timeout, [task descriptor, …]]``. For each task the
worker reads the step's shared state (once per step per process: it is cached) and the
task's input from the step hash, runs the node with ``run_task`` (retry policy, interrupts,
edges and branches included), and records the result with one atomic script: the first
result for a task id is kept, and whichever delivery arrives reports *that* result to the
step's inbox. A task that already has a result is not run again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import redis
from celery import Celery

from bulksync import keys, wire
from bulksync.context import NullResume
from bulksync.coordinator.executor import StepInput, StreamSink, TaskResult
from bulksync.coordinator.nested import NestedInfo
from bulksync.coordinator.options import RunOptions
from bulksync.errors import UnknownGraphError
from bulksync.workers.execute import run_task
from bulksync.workers.local import LocalExecutor
from bulksync.workers.registry import GraphRegistry, task_name, walk_specs

log = logging.getLogger(__name__)

MESSAGE_HEADER: Final = "bulksync"
"""Header marking a message as a bulksync node-task message (its value: the graph id)."""

# KEYS: result key, inbox, step hash. ARGV: result, result TTL, step TTL, keep ("1"/"0").
# Keep the first result unless told not to (an error: the same slot must run again when the
# run is retried); report the kept one to this delivery's inbox while its step lives.
_RECORD_LUA: Final = """
local kept = redis.call('GET', KEYS[1])
if not kept then
  kept = ARGV[1]
  if ARGV[4] == '1' then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RPUSH', KEYS[2], 'r' .. kept)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return kept == ARGV[1] and 1 or 0
"""

_STATE_CACHE_SIZE: Final = 16


class WorkerRuntime:
    """What the node tasks of this process share: the graphs, Redis, a cache of step states."""

    def __init__(self, registry: GraphRegistry, redis_url: str) -> None:
        self.registry = registry
        self.redis_url = redis_url
        self._clients: dict[int, redis.Redis] = {}
        self._states: OrderedDict[str, wire.StepState] = OrderedDict()
        self._lock = threading.Lock()

    def redis(self) -> redis.Redis:
        """This process's Redis client (a pool forked from a parent is never reused)."""
        pid = os.getpid()
        client = self._clients.get(pid)
        if client is None:
            client = redis.Redis.from_url(self.redis_url)
            self._clients = {pid: client}
        return client

    def run_message(
        self,
        graph_id: str,
        path: Sequence[str],
        step_key: str,
        run_id: str,
        timeout: float | None,
        descs: list[Any] | str,
    ) -> int:
        """Run the tasks of one message; return how many ran here (not cancelled or known).

        ``descs`` lists the task descriptors, or names the step-hash field holding them.
        """
        spec = self.registry.spec(graph_id, path)
        r = self.redis()
        descs = self.descriptors(step_key, descs)
        pipe = r.pipeline(transaction=False)
        pipe.exists(keys.cancel(run_id))
        pipe.hmget(
            keys.step(step_key),
            [keys.STATE_FIELD, *(keys.task_input_field(d[0]) for d in descs)],
        )
        pipe.mget([keys.result(d[6]) for d in descs])
        cancelled, fields, known = pipe.execute()
        if cancelled or fields[0] is None:
            return 0  # the run was cancelled, or the step is over: nobody waits for results
        state = self._state(step_key, fields[0])
        null_resume = NullResume(state.null_resume)

        def sink(namespace: Sequence[str], mode: str, chunk: Any) -> None:
            event = wire.EVENT + wire.dumps_event(namespace, mode, chunk)
            r.rpush(keys.inbox(step_key), event)

        step = StepInput(
            channel_values=state.channel_values,
            config=state.config,
            stop=state.stop,
            resume=state.resume,
            resume_map=state.resume_map,
            null_resume=null_resume,
            sink=sink,
            namespace=state.namespace,
            nested=nested_info(state, sink, null_resume),
        )
        ran = 0
        for desc, data, result in zip(descs, fields[1:], known, strict=True):
            keep = True
            if result is None:
                if timeout:  # the coordinator's clock for this task starts now
                    r.rpush(keys.inbox(step_key), wire.STARTED + desc[0].encode())
                task = wire.read_task(desc, wire.loads_input(data))
                outcome = run_task(spec, task, step)
                keep = outcome.error is None
                result = wire.dumps_result(outcome, task.name)
                ran += 1
            self.record(step_key, desc[6], result, keep=keep)
        return ran

    def descriptors(self, step_key: str, descs: list[Any] | str) -> list[Any]:
        """The descriptors a message carries, read from the step hash when it names them."""
        if not isinstance(descs, str):
            return descs
        data = self.redis().hget(keys.step(step_key), descs)
        return wire.loads_descs(data) if isinstance(data, bytes) else []  # None: step over

    def record(self, step_key: str, slot: str, result: bytes, *, keep: bool = True) -> bool:
        """Report ``result`` unless the slot has one (then report that); keep it if ``keep``.

        An error is reported but not kept: a retry of the run must run the task again, as
        in-process runs do. True if ``result`` is the one reported.
        """
        r = self.redis()
        kept = r.eval(
            _RECORD_LUA,
            3,
            keys.result(slot),
            keys.inbox(step_key),
            keys.step(step_key),
            result,
            keys.RESULT_TTL,
            keys.STEP_TTL,
            "1" if keep else "0",
        )
        return bool(kept)

    def reject_unknown(self, message: Any) -> bool:
        """Answer a bulksync message for a graph or node not loaded here with an error result."""
        graph_id = (message.headers or {}).get(MESSAGE_HEADER)
        if not graph_id:
            return False
        args = message.decode()[0]
        step_key, descs = args[2], self.descriptors(args[2], args[5])
        error = UnknownGraphError(
            f"no worker task '{message.headers.get('task')}': graph '{graph_id}' is not loaded "
            f"by this worker (loaded: {', '.join(self.registry.ids()) or 'none'}); start the "
            f"worker with --graph {graph_id}, from the same version of the module."
        )
        log.error("%s", error)
        for task_id, node, *_, slot in descs:
            result = wire.dumps_result(TaskResult(task_id, error=error), node)
            self.record(step_key, slot, result, keep=False)
        return True

    def _state(self, step_key: str, data: bytes) -> wire.StepState:
        with self._lock:
            state = self._states.get(step_key)
            if state is not None:
                self._states.move_to_end(step_key)
                return state
        state = wire.loads_state(data)
        with self._lock:
            self._states[step_key] = state
            while len(self._states) > _STATE_CACHE_SIZE:
                self._states.popitem(last=False)
        return state


def nested_info(state: wire.StepState, sink: StreamSink, null_resume: NullResume) -> Any:
    """The context a graph invoked inside a node nests under, rebuilt on this worker.

    Its tasks run on this worker's threads and its events go to the step's inbox. It has no
    saver: checkpoints stay with the coordinator, so such a graph checkpoints only if it was
    compiled with a checkpointer of its own.
    """
    if state.nesting is None:
        return None
    nesting = state.nesting
    return NestedInfo(
        saver=None,
        executor=LocalExecutor(),
        sink=sink,
        options=RunOptions(
            config=state.config,
            recursion_limit=nesting.recursion_limit,
            durability=nesting.durability,
            modes=frozenset(nesting.modes),
        ),
        resuming=nesting.resuming,
        null_resume=null_resume,
        checkpoint_map=nesting.checkpoint_map,
    )


_runtime: WorkerRuntime | None = None


def current_runtime() -> WorkerRuntime | None:
    """The runtime installed in this process, if any."""
    return _runtime


def install(app: Celery, runtime: WorkerRuntime) -> list[str]:
    """Register a Celery task per node of every loaded graph; return their names."""
    global _runtime
    _runtime = runtime
    names = []
    for graph_id in runtime.registry.ids():
        for path, spec in walk_specs(runtime.registry.get(graph_id)):
            for node in spec.nodes:
                name = task_name(graph_id, path, node)
                if name not in app.tasks:
                    app.task(name=name, shared=False)(_node_task)
                names.append(name)
    return names


def _node_task(
    graph_id: str,
    path: list[str],
    step_key: str,
    run_id: str,
    timeout: float | None,
    descs: list[Any] | str,
) -> int:
    runtime = current_runtime()
    if runtime is None:
        raise RuntimeError("bulksync worker runtime is not installed in this process")
    return runtime.run_message(graph_id, path, step_key, run_id, timeout, descs)
