"""The loop's clock: time-ordered checkpoint ids, stamps and random version bits."""

from __future__ import annotations

import uuid
from datetime import datetime

from bulksync.coordinator import clock
from bulksync.coordinator.apply import VERSION_RANDOM_BITS


def test_checkpoint_ids_sort_in_creation_order_and_carry_the_step() -> None:
    ids = [clock.checkpoint_id(step) for step in range(200)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[5])
    assert parsed.version == 6
    assert parsed.clock_seq & 0x3FFF == 5


def test_a_stamp_is_a_fresh_id_and_the_utc_time() -> None:
    first, second = clock.stamp(1), clock.stamp(1)
    assert first.id < second.id
    assert datetime.fromisoformat(first.ts).utcoffset() is not None


def test_version_bits_fit_the_low_bits_of_a_version() -> None:
    drawn = {clock.version_bits() for _ in range(64)}
    assert all(0 <= b < 1 << VERSION_RANDOM_BITS for b in drawn)
    assert len(drawn) > 1
