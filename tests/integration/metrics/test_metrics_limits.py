"""A metrics query returns at most limits.MAX_METRIC_POINTS points over all its series: its downsample (up to
20,000) times its series (up to 1,000 per job, 50 jobs in a comparison) would otherwise size what the server
builds. On SQLite and PostgreSQL, through the service (the limit is lowered for the test)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kiln.db import migrate
from kiln.db.session import Database
from kiln.domain import limits
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.errors import InvalidInput
from kiln.tasks.metrics_ingest import MetricsStore, parse_lines
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.tracking.metrics import MetricsService, SeriesQuery
from tests.helpers import seed_jobs

ADMIN = Principal(
    user_id="usr-m",
    user_name="usr-m",
    org_id="org-m",
    org_name="org-m",
    key_id="AK",
    role="admin",
    platform_admin=False,
)


@pytest.fixture
def metrics(database_url: str) -> Iterator[MetricsService]:
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine)
        seed_jobs(db, "org-m", "usr-m", {"job-m": {}, "job-n": {}})
        store = MetricsStore(db)
        lines = "".join(
            json.dumps({"t": 1.7e9 + step, "s": step, "w": "worker0", "m": {"a": step, "b": -step, "c": step / 2}})
            + "\n"
            for step in range(100)
        )
        store.write([("job-m", parse_lines(lines), False), ("job-n", parse_lines(lines), False)])
        jobs = JobService(db, DEFAULT_CATALOG, nodes=list, wake=lambda *_: None)
        yield MetricsService(db, jobs, store)
    finally:
        db.dispose()


def test_a_query_over_the_point_limit_is_refused_naming_what_to_narrow(
    metrics: MetricsService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAX_METRIC_POINTS", 250)
    assert [len(s.points) for s in metrics.query(ADMIN, "job-m", SeriesQuery(names=["a", "b"]))] == [100, 100]
    with pytest.raises(InvalidInput, match="over 250 points in one request") as info:
        metrics.query(ADMIN, "job-m", SeriesQuery())  # 3 series of 100
    assert info.value.details == {"field": "downsample"}
    # Downsampled, the same series fit: each is charged what it returns, not what it holds.
    assert [s.count for s in metrics.query(ADMIN, "job-m", SeriesQuery(downsample=50))] == [100, 100, 100]


def test_the_limit_is_over_every_job_of_a_comparison(metrics: MetricsService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_METRIC_POINTS", 250)
    assert len(metrics.compare(ADMIN, ["job-m"], SeriesQuery(names=["a", "b"]))["job-m"]) == 2
    with pytest.raises(InvalidInput, match="over 250 points"):
        metrics.compare(ADMIN, ["job-m", "job-n"], SeriesQuery(names=["a", "b"]))
