"""A canary's rollout policy (kiln.domain.rollout): the fixed-bucket latency histogram's percentiles, and what
``decide`` does with a canary's and the stable version's figures over a step's window."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from kiln.domain.rollout import BUCKET_BOUNDS, RolloutPolicy, VersionStats, decide


def _stats(count: int, errors: int = 0, seconds: float = 0.005) -> VersionStats:
    stats = VersionStats()
    for i in range(count):
        stats.observe(seconds, i < errors, now=100.0)
    return stats


def test_the_histogram_keeps_percentiles_within_a_bucket_and_its_size_fixed() -> None:
    draw = random.Random(7)
    samples = [draw.lognormvariate(-5, 1) for _ in range(20_000)]
    stats = VersionStats()
    for x in samples:
        stats.observe(x, False, now=0.0)
    ordered = sorted(samples)
    for q in (0.5, 0.9, 0.99):
        exact = 1000 * ordered[int(q * len(ordered))]
        got = stats.percentile_ms(q)
        assert got is not None and exact / 1.25 <= got <= exact * 1.25, (q, exact, got)
    assert len(stats.buckets) == len(BUCKET_BOUNDS) + 1  # bounded whatever the traffic
    later = stats.copy()
    later.observe(1.0, True, now=1.0)
    window = later.minus(stats)
    assert (window.requests, window.errors, sum(window.buckets)) == (1, 1, 1)


def test_the_rate_counts_the_last_minute() -> None:
    stats = VersionStats()
    for t in range(120):
        stats.observe(0.001, False, now=float(t))  # one a second for two minutes
    assert stats.rate(119.5) == pytest.approx(1.0)
    assert stats.rate(119.5 + 30) == pytest.approx(0.5)
    assert stats.rate(119.5 + 120) == 0.0


def test_too_few_predicts_get_no_verdict() -> None:
    policy = RolloutPolicy(max_error_rate=0.05, min_requests=50, steps=[50, 100], step_wait=0)
    assert decide(policy, 10, _stats(49, errors=49), _stats(500), waited=999).action == "wait"


def test_a_broken_error_bound_rolls_back_unless_the_stable_version_is_as_bad() -> None:
    policy = RolloutPolicy(max_error_rate=0.05, min_requests=50, steps=[50, 100], step_wait=0)
    canary = _stats(100, errors=20)
    rolled = decide(policy, 10, canary, _stats(1000, errors=1), waited=0)
    assert rolled.action == "rollback" and "error rate 20.0%" in rolled.why, rolled
    assert decide(policy, 10, canary, _stats(1000, errors=300), waited=999).action == "advance"


def test_a_broken_p99_bound_rolls_back() -> None:
    policy = RolloutPolicy(max_p99_ms=50, min_requests=10)
    assert decide(policy, 10, _stats(20, seconds=0.2), _stats(100, seconds=0.01), waited=0).action == "rollback"
    assert decide(policy, 10, _stats(20, seconds=0.02), _stats(100, seconds=0.01), waited=0).action == "wait"


def test_a_healthy_canary_advances_after_each_wait_and_is_promoted_at_100() -> None:
    policy = RolloutPolicy(max_error_rate=0.05, max_p99_ms=100, min_requests=20, steps=[10, 50, 100], step_wait=30)
    healthy, stable = _stats(40, errors=1), _stats(400)
    assert decide(policy, 10, healthy, stable, waited=29).action == "wait"
    assert (decide(policy, 10, healthy, stable, waited=30).action, decide(policy, 10, healthy, stable, 30).weight) == (
        "advance",
        50,
    )
    assert decide(policy, 50, healthy, stable, waited=30).action == "promote"


@pytest.mark.parametrize("steps", [[50, 10], [0, 100], [10, 10], [101]])
def test_steps_rise_within_1_and_100(steps: list[int]) -> None:
    with pytest.raises(ValidationError):
        RolloutPolicy(steps=steps)


def test_a_servers_published_figures_come_back_alike_and_a_vanished_one_shows_negative() -> None:
    stats = _stats(30, errors=3, seconds=0.02)
    back = VersionStats.from_json(stats.to_json())
    assert (back.requests, back.errors, back.buckets, back.percentile_ms(0.99)) == (
        30,
        3,
        stats.buckets,
        stats.percentile_ms(0.99),
    )
    assert VersionStats.from_json({"requests": "x"}).requests == 0  # malformed: empty, not an error
    assert VersionStats.from_json({**stats.to_json(), "buckets": [1, 2]}).requests == 0
    both = stats.plus(_stats(10))
    assert both.requests == 40 and not both.minus(stats).negative
    assert stats.minus(both).negative  # the sum lost a server's figures since the window began
