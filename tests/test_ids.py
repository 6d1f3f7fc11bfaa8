"""The proxy's record ids: UUIDv7, so that later ids sort later (index locality, ids.py)."""

from __future__ import annotations

import time
import uuid

from art_proxy.ids import made_at_s, new_id, short_id


def test_ids_are_uuid7_carrying_the_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    parsed = uuid.UUID(made)
    assert len(made) == 32 and made == parsed.hex
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert before <= int(made[:12], 16) <= after


def test_later_ids_sort_later_and_ids_do_not_repeat() -> None:
    first = [new_id() for _ in range(1000)]
    time.sleep(0.002)
    later = [new_id() for _ in range(1000)]
    assert max(first) < min(later)
    assert len(set(first + later)) == 2000
    # 74 random bits: ids of one millisecond still differ past their time.
    assert len({made[12:] for made in first}) == 1000


def test_a_short_id_is_the_random_end_of_ids_made_here_and_the_start_of_others() -> None:
    ids = [new_id() for _ in range(50)]
    assert len({short_id(made) for made in ids}) == 50
    assert short_id(ids[0]) == ids[0][-8:]
    assert short_id("batch-lyon-1", 5) == "batch"
    assert short_id("0" * 32) == "0" * 8  # 32 hex digits, but not a UUIDv7


def test_an_id_made_here_says_when_it_was_made_and_another_says_nothing() -> None:
    before = time.time()
    made = made_at_s(new_id())
    assert made is not None and before - 0.001 <= made <= time.time()
    assert made_at_s("0" * 32) is None  # 32 hex digits, but not a UUIDv7
    assert made_at_s("call-from-elsewhere") is None
