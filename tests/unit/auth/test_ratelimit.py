"""The per-process token bucket and its share of the limit when several servers share one database."""

from __future__ import annotations

import pytest

from kiln.auth.ratelimit import RateLimiter


def allowed(limiter: RateLimiter, caller: str, tries: int) -> int:
    return sum(limiter.acquire(caller) == 0 for _ in range(tries))


def test_one_server_enforces_the_whole_burst() -> None:
    limiter = RateLimiter(rate=0.001, burst=10)
    assert allowed(limiter, "AK1", 30) == 10
    assert limiter.acquire("AK1") > 0


def test_each_of_n_servers_enforces_one_nth_of_the_rate_and_the_burst() -> None:
    limiter = RateLimiter(rate=0.001, burst=10)
    limiter.share(2)
    assert allowed(limiter, "AK1", 30) == 5
    wait = limiter.acquire("AK1")
    assert wait > 1 / 0.001  # refilled at half the rate: a token takes 2000 s here, not 1000
    limiter.share(3)
    assert allowed(limiter, "AK2", 30) == 3  # 10 / 3: whole requests only


def test_the_share_never_goes_below_one_request_of_burst() -> None:
    limiter = RateLimiter(rate=0.001, burst=2)
    limiter.share(5)
    assert allowed(limiter, "AK1", 10) == 1


def test_a_bucket_fuller_than_a_smaller_share_is_cut_down_to_it() -> None:
    limiter = RateLimiter(rate=0.001, burst=10)
    assert limiter.acquire("AK1") == 0  # 9 left of 10
    limiter.share(2)  # a second server came up: 5 is the most this one may let through at once
    assert allowed(limiter, "AK1", 30) == 5
    limiter.share(1)  # it went away again: the whole burst refills (at the whole rate)
    assert limiter.acquire("AK1") > 0


def test_no_limit_stays_no_limit_and_a_share_of_no_servers_is_refused() -> None:
    limiter = RateLimiter(rate=0, burst=1)
    limiter.share(4)
    assert allowed(limiter, "AK1", 100) == 100
    with pytest.raises(ValueError, match="at least 1"):
        limiter.share(0)
