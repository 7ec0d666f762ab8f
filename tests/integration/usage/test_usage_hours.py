"""Reports that read settled holds from usage_hours say exactly what reading every hold says: random holds (short
and long, open, lately ended, with GPUs, of two categories), three price versions with category and GPU rates,
rolled in batches as the leased task does, then every grouping over windows that start and end mid-hour, on a
whole hour, inside one hour and across the rolled part's edges — on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Organization, Price, UsageDay, UsageHour, UsageRecord, User
from kiln.usecases.usage import usage_hours
from kiln.usecases.usage.usage import UsageService, _versions

HOUR = 3600.0


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database.engine)
    try:
        yield database
    finally:
        database.dispose()


def _seed(db: Database, now: float) -> None:
    rng = random.Random(11)
    with db.transaction() as s:
        s.add(Organization(id="org-x", name="pricing"))
        s.flush()
        s.add(User(id="usr-x", org_id="org-x", name="pricer", role="admin"))
        s.flush()
        for at, cpu, gpu in (
            (now - 20 * 86400, 0.05, 2.0),
            (now - 3 * 86400 - 1234.5, 0.08, 3.0),
            (now - 1800, 0.1, 4.0),
        ):
            s.add(Price(effective_ts=at, resource="cpu", rate=cpu, created_by="usr-x"))
            s.add(Price(effective_ts=at, resource="gpu", gpu_type="H200", rate=gpu, created_by="usr-x"))
            s.add(Price(effective_ts=at, category="serve", resource="cpu", rate=cpu * 2, created_by="usr-x"))
            s.add(Price(effective_ts=at, resource="memory_gib", rate=0.01, created_by="usr-x"))
        for i in range(1500):
            start = now - rng.random() * 10 * 86400
            kind = rng.random()
            if kind < 0.03:
                end = None  # open
            elif kind < 0.08:
                end = min(now - 1, start + rng.uniform(1.2, 4) * 86400)  # longer than a day
            elif kind < 0.12:
                start = now - rng.uniform(60, 900)
                end = now - rng.uniform(0, 50)  # ended lately: not settled
            else:
                end = min(now - 1, start + rng.uniform(10, 3 * HOUR))
            gpus = rng.random() < 0.2
            s.add(
                UsageRecord(
                    org_id=("org-a", "org-b")[i % 2],
                    user_id=f"usr-{i % 7}",
                    job_id=f"job-{i}",
                    attempt=1,
                    category=rng.choice(("train", "serve")),
                    cpus=float(rng.choice((1, 2, 4))),
                    memory=rng.choice((0, 2 * 1024**3)),
                    gpus=1 if gpus else 0,
                    gpu_type="H200" if gpus else "",
                    start_ts=start,
                    end_ts=end,
                    used_cpu_seconds=rng.uniform(0, 100) if end is not None else None,
                    peak_memory=rng.randrange(1, 9) * 1024**2 if end is not None else None,
                )
            )


def _as_dict(found: list[tuple[tuple[str, ...], tuple[float, ...]]]) -> dict[tuple[str, ...], tuple[float, ...]]:
    return dict(found)


def test_reports_from_usage_hours_match_reading_every_hold(db: Database) -> None:
    now = time.time()
    _seed(db, now)
    usage = UsageService(db)
    with db.transaction() as s:
        while usage_hours.roll(s, _versions(s), now - 700, batch=400):  # the task's batches
            pass
    with db.read() as s:
        rolled = s.scalar(select(func.count()).where(UsageRecord.rolled.is_(True)))
        unsettled = s.scalar(select(func.count()).where(UsageRecord.rolled.is_(False)))
        assert rolled and rolled > 1200 and unsettled and unsettled > 40  # both paths have holds to read
        assert s.scalar(select(func.count()).select_from(UsageHour))
        assert s.scalar(select(func.count()).select_from(UsageDay))
        assert s.scalar(select(func.count()).where(UsageRecord.long_hold.is_(True)))
        versions = _versions(s)
        windows = [
            (now - 9 * 86400 - 1234.5, now),  # mid-hour to now
            (now - 30 * 86400, now),  # before every hold
            ((now // HOUR - 50) * HOUR, (now // HOUR - 2) * HOUR),  # whole hours only
            (now - 5 * 86400 + 17.0, now - 2 * 86400 - 999.0),  # mid-hour both ends, long holds across them
            ((now // HOUR - 30) * HOUR + 100.0, (now // HOUR - 30) * HOUR + 2000.0),  # inside one hour
            (now - 2 * HOUR - 5.0, now),  # the last hours: the unsettled and the settled edge
        ]
        groupings = [["org"], ["user"], ["category"], ["gpu_type"], ["day"], ["day", "user"], ["org", "category"]]
        for start, end in windows:
            for keys in groupings:
                for org in (None, "org-b"):
                    every = _as_dict(usage._sums(s, org, start, end, now, keys, versions))
                    hours = _as_dict(usage._figures(s, org, start, end, now, keys, versions))
                    assert set(every) == set(hours), (start, end, keys, org)
                    for key, figures in every.items():
                        assert hours[key] == pytest.approx(figures, rel=1e-9, abs=1e-6), (start, end, keys, org, key)
        # A member's figures (a budget's month) alike.
        start = now - 6 * 86400 - 77.0
        every = usage._sums(s, "org-a", start, now, now, ["org"], versions, user_id="usr-2")
        hours = usage._figures(s, "org-a", start, now, now, ["org"], versions, user_id="usr-2")
        assert [key for key, _ in every] == [key for key, _ in hours] == [("org-a",)]
        assert hours[0][1] == pytest.approx(every[0][1], rel=1e-9)
