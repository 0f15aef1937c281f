"""The executor's one gatherer, on a scripted Redis: nothing taken from an inbox is lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from bulksync.settings import Settings
from bulksync.workers.celery.gatherer import Gatherer

WAIT = 10.0
"""Longest a test waits for the gatherer's thread (a liveness bound)."""


class FakePipe:
    """Records commands; ``execute`` runs them on the fake."""

    def __init__(self, owner: ScriptedRedis) -> None:
        self.owner = owner
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **_: self.calls.append((name, args))

    def execute(self) -> list[Any]:
        self.owner.executed.extend(self.calls)
        return [None for _ in self.calls]


class ScriptedRedis:
    """``blpop``/``lpop`` answer from scripts (a callable per call; an exception is raised),
    as a Redis before 7.0 would: it has no ``BLMPOP``."""

    def __init__(self, blpops: list[Any], lpops: list[Any]) -> None:
        self.blpops = blpops
        self.lpops = lpops
        self.executed: list[tuple[str, tuple[Any, ...]]] = []
        self.lock = threading.Lock()

    def _next(self, script: list[Any]) -> Any:
        with self.lock:
            answer = script.pop(0) if script else None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def blpop(self, names: Sequence[str], timeout: float) -> Any:
        with self.lock:  # an entry of a list not asked for waits, as in Redis, for a call
            waits = (  # that asks for it (its step may join after this call began)
                bool(self.blpops)
                and isinstance(self.blpops[0], tuple)
                and self.blpops[0][0].decode() not in names
            )
        answer = None if waits else self._next(self.blpops)
        if answer is None:
            time.sleep(min(timeout, 0.01))
        return answer

    def lpop(self, name: str, count: int) -> Any:
        self.executed.append(("lpop", (name,)))
        return self._next(self.lpops)

    def blmpop(self, timeout: float, numkeys: int, *names: str, **_: Any) -> Any:
        raise redis.ResponseError("unknown command 'BLMPOP', with args beginning with: ")

    def delete(self, *names: str) -> int:
        self.executed.append(("delete", names))
        return 0

    def pipeline(self, transaction: bool = False) -> FakePipe:
        return FakePipe(self)


class FakeStep:
    """A step owing ``owed`` entries; it closes once it received them all."""

    def __init__(self, inbox: str, owed: int) -> None:
        self.inbox = inbox
        self.last_seen = time.monotonic()
        self.owed = owed
        self.received: list[bytes] = []
        self.closed = threading.Event()

    def receive(self, entries: Sequence[bytes]) -> None:
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
        pipe.exists(self.inbox)

    def settle(self, replies: list[Any]) -> None:
        pass

    def drop_keys(self, pipe: Any) -> None:
        pipe.delete(self.inbox)


def gatherer(fake: ScriptedRedis) -> Gatherer:
    settings = Settings(idle_wait=0.05, reconnect_wait=0.01)
    return Gatherer(fake, settings)  # type: ignore[arg-type]


def join(g: Gatherer, step: FakeStep) -> list[str]:
    """Add ``step`` as a dispatch does: on the pipeline storing it, run then; its commands."""
    pipe = g.redis.pipeline(transaction=False)
    g.add(step, pipe)
    pipe.execute()
    return [name for name, _ in pipe.calls]  # type: ignore[attr-defined]


def wait_closed(step: FakeStep) -> None:
    assert step.closed.wait(WAIT), f"step got only {step.received}"


def test_an_entry_taken_by_blpop_survives_a_failing_drain() -> None:
    """The bug: BLPOP took an entry, the LPOP after it failed, and the entry was dropped."""
    fake = ScriptedRedis(
        blpops=[(b"inbox:a", b"first"), None, (b"inbox:a", b"second")],
        lpops=[redis.ConnectionError("connection reset"), None],
    )
    step = FakeStep("inbox:a", owed=2)
    g = gatherer(fake)
    join(g, step)
    wait_closed(step)
    assert step.received == [b"first", b"second"]


def test_one_thread_gathers_many_steps_and_drops_their_keys_when_done() -> None:
    fake = ScriptedRedis(
        blpops=[(b"inbox:a", b"a1"), (b"inbox:b", b"b1")],
        lpops=[[b"a2"], None],
    )
    a, b = FakeStep("inbox:a", owed=2), FakeStep("inbox:b", owed=1)
    g = gatherer(fake)
    join(g, a)
    join(g, b)
    wait_closed(a)
    wait_closed(b)
    assert a.received == [b"a1", b"a2"]
    assert b.received == [b"b1"]
    deadline = time.monotonic() + WAIT
    while g.steps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g.steps == 0
    deleted = {args[0] for name, args in fake.executed if name == "delete"}
    assert deleted == {"inbox:a", "inbox:b"}


@pytest.mark.parametrize(
    "error", [redis.ConnectionError("refused"), redis.TimeoutError("timed out")]
)
def test_redis_errors_delay_a_step_and_never_end_the_gatherer(error: Exception) -> None:
    fake = ScriptedRedis(blpops=[error, error, (b"inbox:a", b"late")], lpops=[])
    step = FakeStep("inbox:a", owed=1)
    join(gatherer(fake), step)
    wait_closed(step)
    assert step.received == [b"late"]


class SurveyedStep(FakeStep):
    """A step due a claim look every turn, asking ``reads`` reads; it records the replies."""

    def __init__(self, inbox: str, reads: int, armed: threading.Event) -> None:
        super().__init__(inbox, owed=1)
        self.reads = reads
        self.armed = armed
        self.heard: list[list[Any]] = []

    def ask_claims(self, pipe: Any) -> bool:
        if not self.armed.is_set():
            return False
        for n in range(self.reads):
            pipe.mget([f"{self.inbox}:{n}"])
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
    steps = [SurveyedStep(f"inbox:{n}", reads, armed) for n, reads in enumerate((3, 0, 2))]
    g = gatherer(fake)
    for step in steps:
        join(g, step)
    armed.set()  # all three are due from now on
    for step in steps:
        wait_closed(step)
    # Each step got its own replies (three, none, two), all asked in one pipeline.
    assert [[len(r) for r in s.heard[:2]] for s in steps] == [[3, 3], [0, 0], [2, 2]]
    assert 5 in executes


def test_a_step_joining_a_running_gatherer_wakes_it_on_the_pipeline_storing_the_step() -> None:
    fake = ScriptedRedis(blpops=[], lpops=[None, None])
    a, b = FakeStep("inbox:a", owed=1), FakeStep("inbox:b", owed=1)
    g = gatherer(fake)
    assert join(g, a) == []  # the thread it starts lists the inbox in its first BLPOP
    assert join(g, b) == ["rpush", "expire"]  # the wake-up, run with the step's commands
    fake.blpops.extend([(b"inbox:a", b"a1"), (b"inbox:b", b"b1")])  # both are listed now
    wait_closed(a)
    wait_closed(b)


def test_a_removed_step_is_not_gathered() -> None:
    fake = ScriptedRedis(blpops=[], lpops=[])
    g = gatherer(fake)
    step = FakeStep("inbox:a", owed=1)
    join(g, step)
    g.remove(step)
    assert g.steps == 0


class MultiPopRedis(ScriptedRedis):
    """A Redis 7: ``blmpop`` answers from a script of ``(list, entries)``."""

    def __init__(self) -> None:
        super().__init__(blpops=[], lpops=[])
        self.blmpops: list[Any] = []

    def blmpop(self, timeout: float, numkeys: int, *names: str, **_: Any) -> Any:
        answer = self._next(self.blmpops)
        if answer is None:
            time.sleep(min(timeout, 0.01))
        return answer

    def blpop(self, names: Sequence[str], timeout: float) -> Any:
        raise AssertionError("BLPOP on a Redis that has BLMPOP")


def test_one_blmpop_takes_every_wake_up_or_every_entry_of_an_inbox() -> None:
    fake = MultiPopRedis()
    a = FakeStep("inbox:a", owed=3)
    g = gatherer(fake)
    join(g, a)
    wake = g.wake_key.encode()
    fake.blmpops.extend([(wake, [b"1", b"1"]), (b"inbox:a", [b"a1", b"a2", b"a3"])])
    wait_closed(a)
    assert a.received == [b"a1", b"a2", b"a3"]
    # Nothing left to drain, no wake-up left to delete: no other command was needed.
    assert not [name for name, _ in fake.executed if name in ("lpop", "delete")]
