"""The executor's one gatherer, on a scripted Redis: nothing taken from an inbox is lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from bulksync import keys
from bulksync.settings import Settings
from bulksync.workers import wire
from bulksync.workers.celery import gatherer as gathering
from bulksync.workers.celery.gatherer import Backlog, Gatherer

WAIT = 10.0
"""Longest a test waits for the gatherer's thread (a liveness bound)."""


class FakePipe:
    """Records commands; ``execute`` runs them on the fake (``llen`` answers its ``queued``)."""

    def __init__(self, owner: ScriptedRedis) -> None:
        self.owner = owner
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **_: self.calls.append((name, args))

    def execute(self) -> list[Any]:
        self.owner.executed.extend(self.calls)
        return [self.owner.queued if name == "llen" else None for name, _ in self.calls]


class ScriptedRedis:
    """``blpop``/``lpop`` answer from scripts (a callable per call; an exception is raised),
    as a Redis before 7.0 would: it has no ``BLMPOP``."""

    def __init__(self, blpops: list[Any], lpops: list[Any]) -> None:
        self.blpops = blpops
        self.lpops = lpops
        self.executed: list[tuple[str, tuple[Any, ...]]] = []
        self.lock = threading.Lock()
        self.queued = 0  # what LLEN answers

    def _next(self, script: list[Any]) -> Any:
        with self.lock:
            answer = script.pop(0) if script else None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def blpop(self, names: Sequence[str], timeout: float) -> Any:
        self.executed.append(("blpop", tuple(names)))
        answer = self._next(self.blpops)
        if answer is None:
            time.sleep(min(timeout, 0.01))
        return answer

    def lpop(self, name: str, count: int) -> Any:
        self.executed.append(("lpop", (name,)))
        return self._next(self.lpops)

    def blmpop(self, timeout: float, numkeys: int, *names: str, **_: Any) -> Any:
        raise redis.ResponseError("unknown command 'BLMPOP', with args beginning with: ")

    def pipeline(self, transaction: bool = False) -> FakePipe:
        return FakePipe(self)


class FakeStep:
    """A step owing ``owed`` entries; it closes once it received them all."""

    def __init__(self, g: Gatherer, owed: int) -> None:
        self.key = g.new_key()
        self.last_seen = time.monotonic()
        self.owed = owed
        self.received: list[bytes] = []
        self.closed = threading.Event()
        self.backlogs: list[Backlog] = []
        self.receivers: set[threading.Thread] = set()  # the threads that handed it entries

    def entry(self, body: bytes) -> tuple[bytes, bytes]:
        """What BLPOP answers for ``body`` addressed to this step."""
        return (self.key.encode(), wire.addressed(self.key, body))

    def receive(self, entries: Sequence[bytes]) -> None:
        self.receivers.add(threading.current_thread())
        self.received.extend(entries)
        if len(self.received) >= self.owed:
            self.closed.set()

    def is_open(self) -> bool:
        return not self.closed.is_set()

    def wait_hint(self) -> float:
        return 0.05

    def expire(self) -> None:
        pass

    def ask_claims(self, pipe: Any) -> bool:
        return False

    def heard_claims(self, replies: list[Any]) -> None:
        pass

    def probe(self, pipe: Any) -> None:
        pipe.exists(self.key)

    def settle(self, replies: list[Any], backlog: Backlog) -> None:
        self.backlogs.append(backlog)

    def drop_keys(self, pipe: Any) -> None:
        pipe.delete(self.key)


def gatherer(fake: ScriptedRedis) -> Gatherer:
    settings = Settings(idle_wait=0.05, reconnect_wait=0.01)
    return Gatherer(fake, settings)  # type: ignore[arg-type]


def wait_closed(step: FakeStep) -> None:
    assert step.closed.wait(WAIT), f"step got only {step.received}"


def test_an_entry_taken_by_blpop_survives_a_failing_drain() -> None:
    """The bug: BLPOP took an entry, the LPOP after it failed, and the entry was dropped."""
    fake = ScriptedRedis(blpops=[], lpops=[redis.ConnectionError("connection reset"), None])
    g = gatherer(fake)
    step = FakeStep(g, owed=2)
    fake.blpops += [step.entry(b"first"), None, step.entry(b"second")]
    g.add(step)
    wait_closed(step)
    assert step.received == [b"first", b"second"]


def test_one_thread_gathers_many_steps_and_drops_their_keys_when_done() -> None:
    fake = ScriptedRedis(blpops=[], lpops=[])
    g = gatherer(fake)
    a, b = FakeStep(g, owed=2), FakeStep(g, owed=1)
    g.add(a)
    g.add(b)
    # Scripted once both are gathered: an entry taken before its step joins is dropped.
    with fake.lock:
        fake.lpops += [[a.entry(b"a2")[1]], None]
        fake.blpops += [a.entry(b"a1"), b.entry(b"b1")]
    wait_closed(a)
    wait_closed(b)
    assert a.received == [b"a1", b"a2"]
    assert b.received == [b"b1"]
    deadline = time.monotonic() + WAIT
    while g.steps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g.steps == 0
    deleted = {args[0] for name, args in fake.executed if name == "delete"}
    assert deleted == {a.key, b.key}
    # Every call blocked on, or drained, the one inbox of the gatherer.
    assert {args for name, args in fake.executed if name in ("blpop", "lpop")} == {(g.inbox,)}


@pytest.mark.parametrize(
    "error", [redis.ConnectionError("refused"), redis.TimeoutError("timed out")]
)
def test_redis_errors_delay_a_step_and_never_end_the_gatherer(error: Exception) -> None:
    fake = ScriptedRedis(blpops=[error, error], lpops=[])
    g = gatherer(fake)
    step = FakeStep(g, owed=1)
    fake.blpops.append(step.entry(b"late"))
    g.add(step)
    wait_closed(step)
    assert step.received == [b"late"]


class SurveyedStep(FakeStep):
    """A step due a claim look every turn, asking ``reads`` reads; it records the replies."""

    def __init__(self, g: Gatherer, reads: int, armed: threading.Event) -> None:
        super().__init__(g, owed=1)
        self.reads = reads
        self.armed = armed
        self.heard: list[list[Any]] = []

    def ask_claims(self, pipe: Any) -> bool:
        if not self.armed.is_set():
            return False
        for n in range(self.reads):
            pipe.mget([f"{self.key}:{n}"])
        return True

    def heard_claims(self, replies: list[Any]) -> None:
        self.heard.append(replies)
        if len(self.heard) >= 2:
            self.closed.set()


def test_the_claims_of_every_step_due_are_asked_in_one_round_trip() -> None:
    executes = []

    class Counting(ScriptedRedis):
        def pipeline(self, transaction: bool = False) -> FakePipe:
            pipe = FakePipe(self)
            real = pipe.execute

            def execute() -> list[Any]:
                reads = sum(1 for name, _ in pipe.calls if name == "mget")
                if reads:
                    executes.append(reads)
                return real()

            pipe.execute = execute  # type: ignore[method-assign]
            return pipe

    fake = Counting(blpops=[], lpops=[])
    armed = threading.Event()
    g = gatherer(fake)
    steps = [SurveyedStep(g, reads, armed) for reads in (3, 0, 2)]
    for step in steps:
        g.add(step)
    armed.set()  # all three are due from now on
    for step in steps:
        wait_closed(step)
    # Each step got its own replies (three, none, two), all asked in one pipeline.
    assert [[len(r) for r in s.heard[:2]] for s in steps] == [[3, 3], [0, 0], [2, 2]]
    assert 5 in executes


def test_a_step_joining_a_running_gatherer_needs_no_wake_up() -> None:
    fake = ScriptedRedis(blpops=[], lpops=[None, None])
    g = gatherer(fake)
    a = FakeStep(g, owed=1)
    g.add(a)  # the thread starts, and blocks on the inbox
    while not any(name == "blpop" for name, _ in fake.executed):
        time.sleep(0.001)
    b = FakeStep(g, owed=1)
    g.add(b)  # nothing sent: its reports come to the list the thread blocks on
    assert {name for name, _ in fake.executed} == {"blpop"}
    fake.blpops += [b.entry(b"b1"), a.entry(b"a1")]
    wait_closed(a)
    wait_closed(b)


def wait_dropped(g: Gatherer) -> None:
    """Wait until the gatherer's chores dropped its finished steps."""
    deadline = time.monotonic() + WAIT
    while g.steps and time.monotonic() < deadline:
        time.sleep(0.001)
    assert g.steps == 0


def test_the_thread_outlives_its_last_step_and_gathers_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gathering, "LINGER", WAIT)  # however slow this machine is
    fake = ScriptedRedis(blpops=[], lpops=[None, None])
    g = gatherer(fake)
    a = FakeStep(g, owed=1)
    g.add(a)
    fake.blpops.append(a.entry(b"a1"))
    wait_closed(a)
    wait_dropped(g)  # no step left: the thread waits on the inbox
    b = FakeStep(g, owed=1)
    g.add(b)
    fake.blpops.append(b.entry(b"b1"))
    wait_closed(b)
    assert a.receivers == b.receivers  # one thread gathered both
    assert not g.join(0.2)  # and still waits for another step
    monkeypatch.setattr(gathering, "LINGER", 0.0)
    assert g.join(WAIT)  # ends at its next look


def test_the_thread_ends_once_no_step_came_for_a_while() -> None:
    fake = ScriptedRedis(blpops=[], lpops=[None])
    g = gatherer(fake)
    a = FakeStep(g, owed=1)
    g.add(a)
    fake.blpops.append(a.entry(b"a1"))
    wait_closed(a)
    assert g.join(WAIT)
    b = FakeStep(g, owed=1)
    g.add(b)  # a new thread starts for it
    fake.blpops.append(b.entry(b"b1"))
    wait_closed(b)
    assert g.join(WAIT)


def test_a_removed_step_is_not_gathered_and_its_entries_are_dropped() -> None:
    fake = ScriptedRedis(blpops=[], lpops=[])
    g = gatherer(fake)
    gone, kept = FakeStep(g, owed=1), FakeStep(g, owed=1)
    g.add(gone)
    g.remove(gone)
    g.add(kept)
    fake.blpops += [gone.entry(b"late"), kept.entry(b"k1")]
    wait_closed(kept)
    assert gone.received == [] and kept.received == [b"k1"]


class MultiPopRedis(ScriptedRedis):
    """A Redis 7: ``blmpop`` answers from a script of ``(list, entries)``."""

    def __init__(self) -> None:
        super().__init__(blpops=[], lpops=[])
        self.blmpops: list[Any] = []

    def blmpop(self, timeout: float, numkeys: int, *names: str, **_: Any) -> Any:
        self.executed.append(("blmpop", names))
        answer = self._next(self.blmpops)
        if answer is None:
            time.sleep(min(timeout, 0.01))
        return answer

    def blpop(self, names: Sequence[str], timeout: float) -> Any:
        raise AssertionError("BLPOP on a Redis that has BLMPOP")


class FailingStep(FakeStep):
    """A step whose handling of its reports fails (a bug)."""

    def receive(self, entries: Sequence[bytes]) -> None:
        super().receive(entries)
        raise RuntimeError("a bug in this step's handling")


def test_one_blmpop_hands_each_step_its_own_entries_in_order() -> None:
    fake = MultiPopRedis()
    g = gatherer(fake)
    a, b, broken = FakeStep(g, owed=3), FakeStep(g, owed=2), FailingStep(g, owed=1)
    for step in (a, b, broken):
        g.add(step)
    stranger = "another-gatherer.step"  # not gathered here: dropped
    mixed = [
        (a, b"a1"),
        (broken, b"x1"),
        (b, b"b1"),
        (a, b"a2"),
        (stranger, b"s1"),
        (b, b"b2"),
        (a, b"a3"),
    ]
    taken = [wire.addressed(s if isinstance(s, str) else s.key, e) for s, e in mixed]
    fake.blmpops.append((g.inbox.encode(), taken))
    for step in (a, b, broken):
        wait_closed(step)
    assert a.received == [b"a1", b"a2", b"a3"]
    assert b.received == [b"b1", b"b2"]  # though the step before it failed
    assert g.taken == len(taken)
    # One list, blocked on alone; nothing left to drain: no other command was needed.
    assert {names for name, names in fake.executed if name == "blmpop"} == {(g.inbox,)}
    assert not [name for name, _ in fake.executed if name in ("lpop", "delete")]


def test_a_probe_reads_the_inbox_length_after_the_steps_reads() -> None:
    """A result the steps' reads find was reported before the length was read: its report
    is among the entries counted (``Backlog``)."""
    fake = MultiPopRedis()
    fake.queued = 4
    settings = Settings(idle_wait=0.01, reconnect_wait=0.01)
    g = Gatherer(fake, settings)  # type: ignore[arg-type]
    step = FakeStep(g, owed=1)
    g.add(step)
    deadline = time.monotonic() + WAIT
    while not step.backlogs and time.monotonic() < deadline:
        time.sleep(0.005)
    step.closed.set()
    assert step.backlogs, "a quiet step should be probed"
    probe = next(i for i, (name, _) in enumerate(fake.executed) if name == "exists")
    assert fake.executed[probe + 1] == ("llen", (g.inbox,))
    first = step.backlogs[0]
    assert (first.taken, first.through, first.empty) == (0, 4, False)


def test_a_forked_copy_gathers_on_an_inbox_of_its_own() -> None:
    """A server that builds its executor, then forks its workers: each child blocks on its
    own list, or the children would take each other's reports."""
    fake = ScriptedRedis(blpops=[], lpops=[])
    g = gatherer(fake)
    parents = g.new_key()
    g._pid = -1  # as a forked child sees it: made in another process
    step = FakeStep(g, owed=1)
    assert keys.inbox(step.key) == g.inbox != keys.inbox(parents)
    g.add(step)
    fake.blpops.append(step.entry(b"mine"))
    wait_closed(step)
    assert {args for name, args in fake.executed if name == "blpop"} == {(g.inbox,)}
