"""The traffic split's decision (kiln.domain.traffic_split), table style: which track answers a predict."""

from __future__ import annotations

import random

import pytest

from kiln.domain.traffic_split import BUCKETS, Split, bucket, choose
from kiln.errors import NotFound

CANARY_10 = Split(stable_version=1, canary_version=2, canary_weight=10)


@pytest.mark.parametrize(
    ("split", "version", "expected"),
    [
        (CANARY_10, "2", "canary"),
        (CANARY_10, "1", "stable"),
        (Split(1, 2, 0), "2", "canary"),  # no share of the traffic: a targeted predict reaches it all the same
        (Split(1, 2, 100), "1", "stable"),
        (Split(1), "1", "stable"),
    ],
)
def test_a_targeted_version_is_answered_by_its_track(split: Split, version: str, expected: str) -> None:
    assert choose(split, version, None) == expected


@pytest.mark.parametrize("version", ["3", "x", "", "-1", "2.0"])
def test_a_targeted_version_the_service_does_not_serve_is_not_found(version: str) -> None:
    with pytest.raises(NotFound, match="serves 1, 2") as caught:
        choose(CANARY_10, version, None)
    assert caught.value.details == {"field": "X-Kiln-Model-Version"}


def test_without_a_canary_or_with_no_share_everything_is_stable() -> None:
    draw = random.Random(7)
    assert {choose(Split(1), None, None, draw) for _ in range(500)} == {"stable"}
    assert {choose(Split(1, 2, 0), None, f"k{i}", draw) for i in range(500)} == {"stable"}
    assert {choose(Split(1, 2, 100), None, None, draw) for _ in range(500)} == {"canary"}


def test_a_keys_bucket_is_fixed_and_a_larger_share_only_moves_keys_to_the_canary() -> None:
    keys = [f"session-{i}" for i in range(1000)]
    assert [bucket(k) for k in keys] == [bucket(k) for k in keys] and all(0 <= bucket(k) < BUCKETS for k in keys)
    at = {w: {k for k in keys if choose(Split(1, 2, w), None, k) == "canary"} for w in (0, 10, 50, 100)}
    assert at[0] == set() < at[10] < at[50] < at[100] == set(keys)
    assert bucket("user-42") == 5129  # SHA-256, not Python's salted hash: the same on every server and run
