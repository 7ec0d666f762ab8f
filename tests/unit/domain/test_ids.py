"""Identifiers: prefix + 10 chars of time + 6 random chars, lowercase Crockford base32."""

from __future__ import annotations

import re
import time

from kiln.domain.ids import new_id

ID = re.compile(r"^job-[0-9abcdefghjkmnpqrstvwxyz]{16}$")


def test_shape() -> None:
    value = new_id("job")
    assert ID.match(value), value
    assert len(value) == len("job-") + 16


def test_ids_are_unique_and_ordered_within_a_process() -> None:
    made = [new_id("job") for _ in range(20000)]  # many per millisecond
    assert len(set(made)) == len(made)
    assert made == sorted(made)


def test_ids_from_threads_never_collide() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        made = [i for chunk in pool.map(lambda _: [new_id("job") for _ in range(2000)], range(8)) for i in chunk]
    assert len(set(made)) == len(made)


def test_ids_sort_by_creation_time() -> None:
    first = new_id("job")
    time.sleep(0.003)
    second = new_id("job")
    assert first[:14] < second[:14]  # the time part
    assert first < second


def test_time_part_encodes_milliseconds() -> None:
    alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
    before = int(time.time() * 1000)
    value = new_id("x")
    after = int(time.time() * 1000)
    millis = 0
    for ch in value[2:12]:
        millis = millis * 32 + alphabet.index(ch)
    assert before <= millis <= after
