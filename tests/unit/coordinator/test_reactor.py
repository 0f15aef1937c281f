"""The reactor moves many waiting loops on with a few threads (``coordinator/reactor.py``)."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import pytest

from bulksync.coordinator.executor import TaskResult
from bulksync.coordinator.inbox import Await, Inbox, Steps, drive
from bulksync.coordinator.reactor import Reactor, Serial


def _steps(inboxes: list[Inbox], count: int, deadline: float | None = None) -> Steps[list[str]]:
    """A loop of ``count`` one-task steps: each waits for its result, returns the ids."""
    got: list[str] = []
    for _ in range(count):
        inbox = Inbox()
        inboxes.append(inbox)
        ready = yield Await(inbox, 1, deadline)
        if not ready:
            raise TimeoutError("no result")
        got.extend(r.task_id for r in ready)
    return got


class _Ends:
    def __init__(self, expected: int) -> None:
        self.values: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}
        self.threads: set[str] = set()
        self._left = expected
        self._lock = threading.Lock()
        self.all = threading.Event()

    def done(self, key: int) -> Any:
        def record(value: Any, error: BaseException | None) -> None:
            with self._lock:
                self.threads.add(threading.current_thread().name)
                if error is None:
                    self.values[key] = value
                else:
                    self.errors[key] = error
                self._left -= 1
                if not self._left:
                    self.all.set()

        return record


@pytest.fixture
def reactor() -> Any:
    r = Reactor(2, name="test-reactor")
    yield r
    r.close()


def test_many_waiting_loops_share_two_threads(reactor: Reactor) -> None:
    runs, steps = 300, 3
    inboxes: list[list[Inbox]] = [[] for _ in range(runs)]
    ends = _Ends(runs)
    before = threading.active_count()
    for i in range(runs):
        reactor.start(_steps(inboxes[i], steps), ends.done(i))
    for step in range(steps):
        deadline = time.monotonic() + 10
        while any(len(b) <= step for b in inboxes) and time.monotonic() < deadline:
            time.sleep(0.01)  # every loop has reached this step's wait
        # While all of them wait, they hold no thread: two workers and nothing more.
        assert threading.active_count() <= before + 2
        for i, boxes in enumerate(inboxes):
            boxes[step].put(TaskResult(f"{i}-{step}", ()))
    assert ends.all.wait(10)
    assert not ends.errors
    assert ends.values == {i: [f"{i}-{s}" for s in range(steps)] for i in range(runs)}
    assert ends.threads <= {f"test-reactor_{n}" for n in range(2)}


def test_a_result_delivered_before_the_loop_waits_is_not_lost(reactor: Reactor) -> None:
    inbox = Inbox()
    inbox.put(TaskResult("early", ()))

    def steps() -> Steps[list[str]]:
        ready = yield Await(inbox, 5, None)
        return [r.task_id for r in ready]

    ends = _Ends(1)
    reactor.start(steps(), ends.done(0))
    assert ends.all.wait(5)
    assert ends.values == {0: ["early"]}


def test_a_deadline_sends_no_results_and_the_error_reaches_done(reactor: Reactor) -> None:
    inboxes: list[Inbox] = []
    ends = _Ends(1)
    began = time.monotonic()
    reactor.start(_steps(inboxes, 1, deadline=time.monotonic() + 0.2), ends.done(0))
    assert ends.all.wait(5)
    assert isinstance(ends.errors[0], TimeoutError)
    assert time.monotonic() - began >= 0.2


def test_drive_blocks_until_the_loop_ends() -> None:
    inboxes: list[Inbox] = []
    steps = _steps(inboxes, 2)

    def feed() -> None:
        for n in range(2):
            while len(inboxes) <= n:
                time.sleep(0.005)
            inboxes[n].put(TaskResult(f"t{n}", ()))

    threading.Thread(target=feed, daemon=True).start()
    assert drive(steps) == ["t0", "t1"]


class _Interrupting(Inbox):
    """An inbox whose wait is interrupted, as Ctrl-C interrupts the thread that drives."""

    def take(self, limit: int, deadline: float | None) -> list[TaskResult]:
        raise KeyboardInterrupt


def _held(closed: list[str], fail: bool) -> Steps[None]:
    """A loop waiting on an interrupted inbox that, closed, stores what it holds."""
    try:
        yield Await(_Interrupting(), 1, None)
    except GeneratorExit:
        closed.append("stored")
        if fail:
            raise RuntimeError("the store is down") from None
        raise


def test_drive_interrupted_while_it_waits_closes_the_loop_first() -> None:
    closed: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        drive(_held(closed, fail=False))
    assert closed == ["stored"]


def test_a_loop_that_fails_to_close_leaves_the_interruption_to_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller sees the Ctrl-C it pressed; the store's failure is logged."""
    closed: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        drive(_held(closed, fail=True))
    assert closed == ["stored"]
    assert "could not store what it held" in caplog.text
    assert "the store is down" in caplog.text


def test_serial_runs_in_order_one_at_a_time(reactor: Reactor) -> None:
    serial = Serial(reactor)
    seen: list[int] = []
    inside = threading.Semaphore(1)
    finished = threading.Event()

    def job(n: int) -> Any:
        def run() -> None:
            assert inside.acquire(blocking=False), "two jobs of one Serial at once"
            seen.append(n)
            time.sleep(0.001)
            inside.release()
            if n == 49:
                finished.set()

        return run

    for n in range(50):
        serial.submit(job(n))
    assert finished.wait(5)
    assert seen == list(range(50))


def test_a_closed_reactor_drops_work_without_raising() -> None:
    reactor = Reactor(1, name="test-closed")
    reactor.close()
    ran = threading.Event()
    reactor.call(ran.set)  # a result reaching a run after the coordinator stopped
    reactor.later(0, ran.set)
    assert not ran.wait(0.2)


def test_work_kept_for_when_a_loop_waits_runs_after_its_step(reactor: Reactor) -> None:
    order: list[str] = []
    inbox = Inbox()
    ended = threading.Event()

    def loop() -> Steps[None]:
        for step in range(2):
            reactor.when_waiting(lambda step=step: order.append(f"events {step}"))
            order.append(f"publish {step}")  # the step's own work goes first
            yield Await(inbox, 1, None)
        reactor.when_waiting(lambda: order.append("last events"))
        order.append("end")

    reactor.start(loop(), lambda value, error: ended.set())
    deadline = time.monotonic() + 10
    while "events 0" not in order and time.monotonic() < deadline:
        time.sleep(0.01)
    assert order == ["publish 0", "events 0"]  # kept until the loop waited, then run
    inbox.put(TaskResult("t0", ()))
    inbox.put(TaskResult("t1", ()))  # both steps' results at once: one turn, two waits
    assert ended.wait(10)
    assert order == ["publish 0", "events 0", "publish 1", "events 1", "end", "last events"]
    reactor.when_waiting(lambda: order.append("off a turn"))  # no loop moving on: at once
    assert order[-1] == "off a turn"


def test_a_finished_run_is_freed_though_its_inbox_lives_on(reactor: Reactor) -> None:
    # A coordinator's step keeps its inbox (its results callback) a while after the run: the
    # run's objects, reached through its ``done`` callback, must not wait for a collection.
    class Run:
        pass

    run = Run()
    freed = weakref.ref(run)
    ended = threading.Event()

    def done(value: Any, error: BaseException | None, run: Run = run) -> None:
        ended.set()

    inboxes: list[Inbox] = []
    reactor.start(_steps(inboxes, 1), done)
    del run, done
    deadline = time.monotonic() + 10
    while not inboxes and time.monotonic() < deadline:
        time.sleep(0.01)
    inboxes[0].put(TaskResult("t", ()))
    assert ended.wait(10)
    while freed() is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # the reactor thread returns from ``done``
    assert freed() is None


def test_an_earlier_deadline_on_the_same_inbox_wakes_the_loop(reactor: Reactor) -> None:
    inbox = Inbox()
    seen: list[list[str]] = []

    def steps() -> Steps[list[list[str]]]:
        ready = yield Await(inbox, 2, time.monotonic() + 30)
        seen.append([r.task_id for r in ready])
        ready = yield Await(inbox, 1, time.monotonic() + 0.1)  # e.g. writes kept are due
        seen.append([r.task_id for r in ready])
        return seen

    ends = _Ends(1)
    reactor.start(steps(), ends.done(0))
    inbox.put(TaskResult("first", ()))
    assert ends.all.wait(5), "the loop slept past its second, earlier deadline"
    assert ends.values == {0: [["first"], []]}
