"""``Rounds``: who sends which entries, and when (real threads, no services)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from bulksync.rounds import Rounds

WAIT = 10.0


class Sender:
    """A ``send`` that records each batch; its first round waits until ``release()``."""

    def __init__(self, *, fail: set[str] | None = None) -> None:
        self.batches: list[list[str]] = []
        self.senders: list[str] = []  # the thread that sent each batch
        self.settled: dict[str, str] = {}
        self._fail = fail or set()
        self._gate = threading.Event()
        self._entered = threading.Event()

    def release(self) -> None:
        self._gate.set()

    def wait_entered(self) -> None:
        assert self._entered.wait(WAIT)

    def __call__(self, batch: list[str]) -> None:
        self.batches.append(list(batch))
        self.senders.append(threading.current_thread().name)
        self._entered.set()
        assert self._gate.wait(WAIT)
        for entry in batch:
            self.settled[entry] = "sent"
        if self._fail & set(batch):
            raise RuntimeError(f"round {batch} failed")


def start(rounds: Rounds[str], entry: str, send: Callable[[list[str]], None]) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            rounds.join(entry, send)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=entry)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_a_lone_entry_is_sent_at_once() -> None:
    rounds: Rounds[str] = Rounds()
    sender = Sender()
    sender.release()
    rounds.join("a", sender)
    assert sender.batches == [["a"]]
    assert not rounds.busy and rounds.waiting == 0


def test_entries_that_arrive_during_a_round_share_the_next() -> None:
    rounds: Rounds[str] = Rounds()
    sender = Sender()
    first = start(rounds, "a", sender)
    sender.wait_entered()
    others = [start(rounds, name, sender) for name in "bcd"]
    wait_for(lambda: rounds.waiting == 3)
    assert rounds.busy
    sender.release()
    for thread in [first, *others]:
        thread.join(WAIT)
    assert sender.batches[0] == ["a"]
    assert sorted(sender.batches[1]) == ["b", "c", "d"]
    assert len(sender.batches) == 2
    assert sender.settled == dict.fromkeys("abcd", "sent")


def test_most_caps_a_round_of_the_longest_waiting_and_its_sender() -> None:
    rounds: Rounds[str] = Rounds(most=2)
    sender = Sender()
    first = start(rounds, "a", sender)
    sender.wait_entered()
    others = []
    for name in "bcde":
        others.append(start(rounds, name, sender))
        queued = len(others)
        wait_for(lambda queued=queued: rounds.waiting == queued)  # arrival order is known
    sender.release()
    for thread in [first, *others]:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert sender.batches[0] == ["a"]
    remaining = list("bcde")
    for by, batch in zip(sender.senders[1:], sender.batches[1:], strict=True):
        assert len(batch) <= 2
        assert remaining[0] in batch  # the longest waiting goes first
        assert by in batch  # whoever sends a round is in it
        remaining = [e for e in remaining if e not in batch]
    assert remaining == []


def test_a_failing_round_raises_for_its_sender_only() -> None:
    rounds: Rounds[str] = Rounds()
    sender = Sender(fail={"b"})
    first = start(rounds, "a", sender)
    sender.wait_entered()
    others = [start(rounds, name, sender) for name in "bc"]
    wait_for(lambda: rounds.waiting == 2)
    sender.release()
    for thread in [first, *others]:
        thread.join(WAIT)
    raised = [t.name for t in others if t.errors]  # type: ignore[attr-defined]
    assert raised == [sender.senders[1]]  # the one that sent the round holding "b"
    assert first.errors == []  # type: ignore[attr-defined]
    assert sender.settled == dict.fromkeys("abc", "sent")
    # The next caller is not held back by the failed round.
    rounds.join("d", sender)
    assert sender.batches[-1] == ["d"]


def test_a_send_taken_alone_holds_the_others_until_given_back() -> None:
    rounds: Rounds[str] = Rounds()
    sender = Sender()
    sender.release()
    assert rounds.take()
    assert rounds.busy and not rounds.take()  # one at a time
    others = [start(rounds, name, sender) for name in "ab"]
    wait_for(lambda: rounds.waiting == 2)
    assert sender.batches == []
    rounds.give_back()
    for thread in others:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert [sorted(b) for b in sender.batches] == [["a", "b"]]  # together, once let go
    assert not rounds.busy and rounds.take()
    rounds.give_back()


def test_a_send_is_not_taken_while_a_round_is_sent_or_waited_for() -> None:
    rounds: Rounds[str] = Rounds()
    sender = Sender()
    first = start(rounds, "a", sender)
    sender.wait_entered()
    assert not rounds.take()
    second = start(rounds, "b", sender)
    wait_for(lambda: rounds.waiting == 1)
    sender.release()
    for thread in (first, second):
        thread.join(WAIT)
    assert rounds.take()  # idle again
    rounds.give_back()


def test_a_round_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        Rounds(most=0)


@pytest.mark.parametrize("most", [None, 1, 3])
def test_many_callers_each_sent_once_none_left_asleep(most: int | None) -> None:
    # A round's end wakes its own callers and the longest waiting other (the next sender)
    # only: a wake-up lost there would leave a caller asleep, and this join time out.
    rounds: Rounds[tuple[int, int]] = Rounds(most=most)
    sent: list[tuple[int, int]] = []

    def send(batch: list[tuple[int, int]]) -> None:
        assert most is None or len(batch) <= most
        sent.extend(batch)
        time.sleep(0.0005)  # on the wire: the others pile up behind it

    def caller(i: int) -> None:
        for j in range(20):
            rounds.join((i, j), send)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive(), "a caller was left waiting"
    assert sorted(sent) == [(i, j) for i in range(16) for j in range(20)]
    assert rounds.waiting == 0 and not rounds.busy
