"""Every Redis key bulksync uses, built here and nowhere else.

::

    key                                   type    holds                               lifetime
    bulksync:step:<step key>              hash    ``state``: the step's claim check   until the
                                                  (channel values, config, resume);   step ends
                                                  ``in:<task id>``: a task's input;   (TTL guard)
                                                  ``batch:<message id>``: the task
                                                  descriptors of a batched message
    bulksync:inbox:<gatherer id>          list    what workers report for the steps   step_ttl
                                                  one gatherer gathers, in order,     after a
                                                  each entry addressed to its step:   result, or
                                                  results, custom stream events, …    taken
    bulksync:result:<slot>                string  a task's first result (first wins)  until its
                                                                                      step's
                                                                                      checkpoint
                                                                                      is committed
                                                                                      (*)
    bulksync:claim:<slot>                 string  the token of the worker process     claim_lease,
                                                  running the task (SET NX)           renewed by
                                                                                      heartbeats
    bulksync:deliveries:<slot>            string  how many times a worker started     as result
                                                  the task                            (*)
    bulksync:cancel:<run id>              string  present once a run is cancelled     run_ttl
    bulksync:cancel-step:<step key>       string  present once a step is cancelled    step_ttl
    bulksync:steps:<run id>               set     the step keys of the run's live     run_ttl
                                                  steps
    bulksync:events:<run id>              stream  a detached run's stream events      run_ttl
    bulksync:wake                         list    "a run was submitted" signals       trimmed
    bulksync:served:<graph id>            zset    coordinators serving the graph,     members
                                                  scored by when their claim lapses   lapse

(*) Or, in a root graph without a saver, until the step is applied. A step that a restart may
dispatch again keeps them for ``result_ttl``: under ``durability="exit"``, in a subgraph that
stores no checkpoints, a step that stopped (failed, paused, cancelled) or a coordinator that
died.

A *step key* is ``<gatherer id>.<random id>``, one per dispatched step, so a step dispatched
again after a coordinator crash never mixes with the old one, and a worker knows from it
alone where to report: the inbox of the gatherer that waits for the step (``inbox``); each
entry there starts with the step key it is for (``wire.addressed``). Task ids are unique
across runs (they hash the checkpoint id), so a result *slot* is the task id — plus a digest
of the resume answers the task runs with, when it has any: a task that paused on an
interrupt runs again, under a new slot, once it is resumed. Results survive a coordinator
crash.

A worker claims a slot before running it (``claim``: one live runner per task, its lease
renewed by a heartbeat while the task runs) and counts its start (``deliveries``); a claim
whose worker died expires, and the coordinator dispatches the task again.

Lifetimes are settings (``step_ttl`` guards the step keys, ``result_ttl``, ``run_ttl``,
``claim_lease``): the
callers that set a key pass its TTL from the ``Settings`` they hold, so this module, at the
bottom of the layers, knows no settings.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "bulksync"

STATE_FIELD: Final = "state"
WAKE: Final = f"{PREFIX}:wake"


def served(graph_id: str) -> str:
    """The coordinators that serve ``graph_id``, each scored by the Redis time its claim ends."""
    return f"{PREFIX}:served:{graph_id}"


def step(step_key: str) -> str:
    """The hash holding a step's shared state and its tasks' inputs."""
    return f"{PREFIX}:step:{step_key}"


def task_input_field(task_id: str) -> str:
    """The field of the step hash holding one task's input."""
    return f"in:{task_id}"


def batch_field(message_id: str) -> str:
    """The field of the step hash holding the task descriptors of one batched message."""
    return f"batch:{message_id}"


def inbox(step_key: str) -> str:
    """The list workers push a step's results and custom events to: that of the gatherer
    waiting for the step, named by the step key's part before its first ``.``. One list for
    all of a gatherer's steps: it blocks on one key however many steps are in flight."""
    return f"{PREFIX}:inbox:{step_key.partition('.')[0]}"


def reply(request_id: str) -> str:
    """Where the coordinator answers a worker's request (a checkpoint read)."""
    return f"{PREFIX}:reply:{request_id}"


def result(slot: str) -> str:
    """The first result recorded for a task run with given resume answers (``wire.slot``)."""
    return f"{PREFIX}:result:{slot}"


def claim(slot: str) -> str:
    """Held by the worker running the task while it lives; a second delivery leaves it be."""
    return f"{PREFIX}:claim:{slot}"


def deliveries(slot: str) -> str:
    """How many times workers started the task: a poison task stops at a limit."""
    return f"{PREFIX}:deliveries:{slot}"


def cancel(run_id: str) -> str:
    """Set once the run is cancelled; workers skip its tasks."""
    return f"{PREFIX}:cancel:{run_id}"


def step_cancel(step_key: str) -> str:
    """Set once a step is cancelled (a task failed, a step timeout, a caller left): workers
    stop its running async nodes."""
    return f"{PREFIX}:cancel-step:{step_key}"


def run_steps(run_id: str) -> str:
    """The live steps of a run, whose gatherers a cancel request must wake."""
    return f"{PREFIX}:steps:{run_id}"


def events(run_id: str) -> str:
    """The stream a detached run's events go to (read with XREAD, resumable by id)."""
    return f"{PREFIX}:events:{run_id}"
