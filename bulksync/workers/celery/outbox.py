"""Steps stored and published together: one round trip, and shared messages, for the steps
of different runs that are ready at the same moment.

A coordinator drives many runs; each step stores itself and publishes its messages in one
Redis round trip (``step.py``). :class:`Outbox` lets the steps whose dispatch meets another's
in flight ride the next round trip together (``bulksync.rounds``, group commit): the first
step sends at once, alone; steps that arrive while it is on the wire wait, and whichever of
them comes first sends them all when it returns. Nothing waits for company: a lone step pays
no more than before, and under load the round trips, and the waits, are shared.

Steps sent together also share messages: single-task messages of one node task and queue are
joined, ``max_merged`` at a time (``publish.merge``). Celery spends more on each message a
worker receives (its bookkeeping, its ``task-received``, ``task-started`` and
``task-succeeded`` events, its hand-off to the pool) than a quick node takes to run, so
fewer messages is most of what a busy cluster can save. A joined message is never revoked:
it carries other runs' tasks (``CeleryStep._shared``). A cancelled run's task in one stops on
the worker as any task of a cancelled step does; a task past its time limit is delivered as
timed out at its deadline, as any, and a prefork worker stops it at the message's hard time
limit (the sum of its tasks').
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from bulksync.rounds import Rounds
from bulksync.workers.celery.publish import DirectPublisher, Outgoing, merge


class _Entry:
    """One step's commands and messages, and what became of them."""

    __slots__ = ("commands", "messages", "starting", "replies", "joined", "error")

    def __init__(
        self,
        commands: Callable[[Any], None],
        messages: Sequence[Outgoing],
        starting: Callable[[], None] | None,
    ) -> None:
        self.commands = commands
        self.messages = messages
        self.starting = starting
        self.replies: list[Any] = []
        self.joined: set[str] = set()
        self.error: BaseException | None = None


class Outbox:
    """Sends the steps of concurrent dispatches in shared round trips (module docstring)."""

    def __init__(self, r: redis.Redis, direct: DirectPublisher, most: int) -> None:
        self._redis = r
        self._direct = direct
        self._most = most
        self._rounds: Rounds[_Entry] = Rounds()

    def send(
        self,
        commands: Callable[[Any], None],
        messages: Sequence[Outgoing],
        starting: Callable[[], None] | None = None,
    ) -> tuple[list[Any], set[str]]:
        """Queue ``commands`` (called with the pipeline) and publish ``messages``, with the
        steps sent at the same moment; the replies to ``commands``, and the ids of
        ``messages`` joined with others'.

        ``starting`` is called before anything of the step is sent, as late as it can be:
        for a step sent alone, once its round trip is built (the checkpoint it starts from,
        still being committed meanwhile, is confirmed then: ``StepLive.starting``); before
        it joins, when others are on the wire.

        Raises:
            redis.RedisError: the round trip failed (for every step in it; each retries), or
                one of ``commands`` did (for this step alone).
            Exception: what ``commands`` or ``starting`` raised (the other steps go without
                this one; nothing of it is sent).
        """
        if starting is not None and (self._rounds.busy or self._rounds.waiting):
            starting()
            starting = None
        entry = _Entry(commands, messages, starting)
        self._rounds.join(entry, self._send)
        if entry.error is not None:
            raise entry.error
        return entry.replies, entry.joined

    def _send(self, batch: list[_Entry]) -> None:
        """One round trip for ``batch``; each entry learns its replies, or its error."""
        try:
            if len(batch) > 1:  # (a step that found the outbox idle, joined by others)
                for entry in batch:
                    _start(entry)
            pipe = self._redis.pipeline(transaction=False)
            sent: list[tuple[_Entry, int, int]] = []
            for entry in batch:
                if entry.error is not None:
                    continue
                start = len(pipe)
                try:
                    entry.commands(pipe)
                except Exception as exc:  # that step's own: the others go on without it
                    del pipe.command_stack[start:]
                    entry.error = exc
                    continue
                sent.append((entry, start, len(pipe)))
            messages = [m for entry, _, _ in sent for m in entry.messages]
            merged, joined = merge(messages, self._most) if len(sent) > 1 else (messages, set())
            self._direct.queue(pipe, merged)
            if len(batch) == 1 and sent:
                _start(batch[0])
                if batch[0].error is not None:
                    return  # nothing of it sent
            replies = pipe.execute(raise_on_error=False) if len(pipe) else []
        except BaseException as exc:  # the connection: every step's
            for entry in batch:
                entry.error = entry.error or exc
            raise
        # A command's error is its step's own; the messages' is every step's.
        published = _error(replies[sent[-1][2] :] if sent else replies)
        for entry, start, end in sent:
            entry.replies = replies[start:end]
            entry.joined = {m.task_id for m in entry.messages} & joined
            entry.error = published or _error(entry.replies)


def _start(entry: _Entry) -> None:
    """Call ``entry``'s ``starting`` once; what it raises becomes the entry's error."""
    starting, entry.starting = entry.starting, None
    if starting is not None:
        try:
            starting()
        except Exception as exc:
            entry.error = exc


def _error(replies: list[Any]) -> Exception | None:
    """The first error among ``replies``, if any."""
    return next((r for r in replies if isinstance(r, Exception)), None)
