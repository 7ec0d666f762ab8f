"""The spare network pool's sizing (``backends/local/netpool.py``): as many spares per mode as the starts of the
last ten seconds, within the operator's minimum and maximum; made for the mode furthest short; an idle pool lets
go of the rest one at a time. The namespaces themselves are tried in tests/integration/test_network_pool.py."""

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


def test_the_target_follows_the_starts_of_the_last_ten_seconds(tmp_path: Path, clock: Clock) -> None:
    pool = _pool(tmp_path)
    assert pool.target("isolated") == pool.target("none") == 2  # idle: the minimum
    for _ in range(4):
        assert not _start(pool, "isolated", tmp_path)  # none ready: the attempt makes its own, and it is counted
    assert (pool.target("isolated"), pool.target("none")) == (4, 2)
    assert pool.misses == {"isolated": 4, "none": 0}
    for _ in range(10):
        _start(pool, "isolated", tmp_path)
    assert pool.target("isolated") == 5  # the maximum
    clock.now += netpool.WINDOW_SECONDS + 0.1
    assert pool.target("isolated") == 2  # the burst is over


def test_spares_are_made_for_the_mode_furthest_short_and_the_rest_let_go(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = _pool(tmp_path)
    made: list[str] = []

    def make(mode: str) -> Path:
        made.append(mode)
        return tmp_path / f"spare-{mode}-{len(made)}"

    monkeypatch.setattr(pool, "_make", make)
    for _ in range(4):
        _start(pool, "none", tmp_path)
    while pool.fill_once() == 0.0:
        pass
    assert made.count("none") == 4 and made.count("isolated") == 2
    assert (pool.ready("none"), pool.ready("isolated")) == (4, 2)
    clock.now += netpool.WINDOW_SECONDS + 0.1
    assert pool.fill_once() == netpool.TRIM_SECONDS  # one let go a step, down to the minimum
    assert pool.fill_once() == netpool.TRIM_SECONDS
    assert pool.fill_once() is None
    assert (pool.ready("none"), pool.ready("isolated")) == (2, 2)


def test_a_mode_that_is_not_namespaced_takes_nothing(tmp_path: Path, clock: Clock) -> None:
    pool = _pool(tmp_path)
    assert not pool.take({"mode": "host", "dir": str(tmp_path / "attempt")})
    assert pool.misses == {"isolated": 0, "none": 0}
