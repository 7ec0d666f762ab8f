"""The spare network pool's sizing (``backends/local/netpool.py``): as many spares per mode as the starts expected
while spares are made (the rate of the last second times the lead), within the operator's minimum and maximum, so
a burst that is over makes no more; made for the mode furthest short; spares beyond the target kept while starts
are recent, then let go one at a time; the counters. The namespaces themselves are tried in
tests/integration/local/test_network_pool.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kiln.backends.local import netpool
from kiln.backends.local.network import Networking


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(netpool.time, "monotonic", c)
    return c


def _pool(tmp_path: Path, low: int = 2, high: int = 5) -> netpool.SparePool:
    settings: Any = SimpleNamespace(run_dir=tmp_path / "run", network_pool_min=low, network_pool_max=high)
    return netpool.SparePool(Networking(True, "test", "/usr/bin/pasta", "/usr/sbin/nft"), settings)


def _start(pool: netpool.SparePool, mode: str, tmp_path: Path) -> bool:
    return pool.take({"mode": mode, "dir": str(tmp_path / "attempt")})


def test_the_target_follows_the_start_rate_times_the_lead(tmp_path: Path, clock: Clock) -> None:
    pool = _pool(tmp_path, high=32)
    assert pool.target("isolated") == pool.target("none") == 2  # idle: the minimum
    for _ in range(20):  # 20 starts in the last second: 20/s
        assert not _start(pool, "isolated", tmp_path)  # none ready: the attempt makes its own, and it is counted
    assert pool.misses == {"isolated": 20, "none": 0}
    # The starts expected within the lead (LEAD_SECONDS while spares are made quickly): 20/s x 0.25 s.
    assert (pool.target("isolated"), pool.target("none")) == (5, 2)
    pool._build_seconds["isolated"] = 0.5  # making one takes 0.5 s now: the lead is twice that
    assert pool.target("isolated") == 20
    for _ in range(40):
        _start(pool, "isolated", tmp_path)
    assert pool.target("isolated") == 32  # the maximum
    clock.now += netpool.RATE_SECONDS + 0.01
    assert pool.target("isolated") == 2  # the burst is over: nothing more is made for it


def test_spares_are_made_for_the_mode_furthest_short_and_the_rest_let_go(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = _pool(tmp_path)
    made: list[str] = []

    def make(mode: str) -> tuple[Path, dict[str, Any]]:
        made.append(mode)
        return tmp_path / f"spare-{mode}-{len(made)}", {"mode": mode}

    monkeypatch.setattr(pool, "_make", make)
    for _ in range(16):  # 16/s: 4 expected within the lead
        _start(pool, "none", tmp_path)
    while pool.fill_once() == 0.0:
        pass
    assert made.count("none") == 4 and made.count("isolated") == 2
    assert (pool.ready("none"), pool.ready("isolated")) == (4, 2)
    clock.now += netpool.RATE_SECONDS + 0.01  # the burst is over: the two beyond the minimum are kept a while
    wait = pool.fill_once()
    assert wait is not None and netpool.TRIM_SECONDS <= wait <= netpool.WINDOW_SECONDS
    assert made.count("none") == 4 and pool.ready("none") == 4
    clock.now += netpool.WINDOW_SECONDS
    assert pool.fill_once() == netpool.TRIM_SECONDS  # one let go a step, down to the minimum
    assert pool.fill_once() == netpool.TRIM_SECONDS
    assert pool.fill_once() is None
    assert (pool.ready("none"), pool.ready("isolated")) == (2, 2)
    assert pool.counters()["none"] == {"handed_out": 0, "misses": 16, "made": 4, "let_go": 2, "reused": 0, "ready": 2}


def test_a_burst_that_ended_makes_nothing_more(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The overshoot: 100 starts at 30/s while making a spare takes 50 ms; once they stop, the pool makes at most
    what the last second's rate asked for, not its maximum."""
    pool = _pool(tmp_path, low=2, high=32)
    made: list[str] = []

    def make(mode: str) -> tuple[Path, dict[str, Any]]:
        made.append(mode)
        clock.now += 0.05
        return tmp_path / f"spare-{mode}-{len(made)}", netpool.netns.made_for({"mode": mode})

    monkeypatch.setattr(pool, "_make", make)
    monkeypatch.setattr(netpool.netns, "cleanup", lambda _path: None)
    monkeypatch.setattr(Path, "rename", lambda self, target: target)
    monkeypatch.setattr(Path, "mkdir", lambda self, **_kw: None)
    for _ in range(100):
        clock.now += 1 / 30
        _start(pool, "isolated", tmp_path)
        pool.fill_once()  # the filler makes one per start at most here (it is as fast as the starts)
    while pool.fill_once() == 0.0:
        pass
    clock.now += netpool.RATE_SECONDS + 0.01
    while pool.fill_once() == 0.0:
        pass
    left = pool.counters()["isolated"]
    assert left["handed_out"] + left["misses"] == 100
    assert made.count("isolated") - left["handed_out"] <= 10, left  # was up to 32 more than were used


def test_a_mode_that_is_not_namespaced_takes_nothing(tmp_path: Path, clock: Clock) -> None:
    pool = _pool(tmp_path)
    assert not pool.take({"mode": "host", "dir": str(tmp_path / "attempt")})
    assert pool.misses == {"isolated": 0, "none": 0}
