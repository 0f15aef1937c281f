"""Every Redis key bulksync uses, built here and nowhere else.

::

    key                                   type    holds                               lifetime
    bulksync:step:<step key>              hash    ``state``: the step's claim check   until the
                                                  (channel values, config, resume);   step ends
                                                  ``in:<task id>``: a task's input;   (TTL guard)
                                                  ``batch:<message id>``: the task
                                                  descriptors of a batched message
    bulksync:inbox:<step key>             list    what workers report, in order:      until the
                                                  results and custom stream events    step ends
    bulksync:result:<slot>                string  a task's first result (first wins)  RESULT_TTL
    bulksync:cancel:<run id>              string  present once a run is cancelled     RUN_TTL
    bulksync:inboxes:<run id>             set     inbox keys of the run's live steps  RUN_TTL
    bulksync:events:<run id>              stream  a detached run's stream events      RUN_TTL
    bulksync:wake                         list    "a run was submitted" signals       trimmed

A *step key* is a random id per dispatched step, so a step dispatched again after a
coordinator crash never mixes with the old one. Task ids are unique across runs (they hash
the checkpoint id), so a result *slot* is the task id — plus a digest of the resume answers
the task runs with, when it has any: a task that paused on an interrupt runs again, under a
new slot, once it is resumed. Results survive a coordinator crash.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "bulksync"

STEP_TTL: Final = 24 * 3600
"""Seconds a step's state and inbox live if the coordinator dies before dropping them."""

RESULT_TTL: Final = 24 * 3600
"""Seconds a task's result is kept: long enough for a restarted coordinator to collect it."""

RUN_TTL: Final = 7 * 24 * 3600
"""Seconds a run's stream, cancel flag and inbox set outlive the run's last write."""

STATE_FIELD: Final = "state"
WAKE: Final = f"{PREFIX}:wake"


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
    """The list workers push a step's results and custom events to."""
    return f"{PREFIX}:inbox:{step_key}"


def result(slot: str) -> str:
    """The first result recorded for a task run with given resume answers (``wire.slot``)."""
    return f"{PREFIX}:result:{slot}"


def cancel(run_id: str) -> str:
    """Set once the run is cancelled; workers skip its tasks."""
    return f"{PREFIX}:cancel:{run_id}"


def run_inboxes(run_id: str) -> str:
    """The inboxes a cancel request must wake."""
    return f"{PREFIX}:inboxes:{run_id}"


def events(run_id: str) -> str:
    """The stream a detached run's events go to (read with XREAD, resumable by id)."""
    return f"{PREFIX}:events:{run_id}"
