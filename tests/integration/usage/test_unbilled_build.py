"""A shared runtime's build is not billed to the job that waited for it (kiln.usecases.usage.usage.unbill_usage):
the open hold starts that much later, never past the moment the command started, whatever a shim's file says; a
closed hold and other jobs' holds are left alone. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import UsageRecord
from kiln.usecases.usage.usage import unbill_usage

T0 = 1_800_000_000.0


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database.engine)
    try:
        yield database
    finally:
        database.dispose()


def _hold(job_id: str, start: float, end: float | None = None) -> UsageRecord:
    return UsageRecord(
        org_id="org-1",
        user_id="usr-1",
        job_id=job_id,
        attempt=1,
        category="train",
        cpus=2.0,
        start_ts=start,
        end_ts=end,
    )


def _starts(db: Database) -> dict[str, list[float]]:
    with db.transaction() as s:
        rows = s.execute(select(UsageRecord.job_id, UsageRecord.start_ts).order_by(UsageRecord.id)).all()
    found: dict[str, list[float]] = {}
    for job_id, start in rows:
        found.setdefault(job_id, []).append(start)
    return found


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, UTC)


def test_the_open_hold_starts_after_the_build_and_never_past_the_commands_start(db: Database) -> None:
    with db.transaction() as s:
        s.add_all([_hold("job-a", T0, T0 + 5), _hold("job-a", T0 + 10), _hold("job-b", T0), _hold("job-c", T0)])
    with db.transaction() as s:
        unbill_usage(s, "job-a", 6.5, until=at(20))  # built for 6.5 s; its command started at 20 s
        unbill_usage(s, "job-b", 10**6, until=at(8))  # a shim's file claims far more: bounded by the start
        unbill_usage(s, "job-c", 0, until=at(8))
    starts = _starts(db)
    assert starts["job-a"] == [T0, T0 + 16.5]  # the closed hold (an earlier attempt) keeps its start
    assert starts["job-b"] == [T0 + 8]
    assert starts["job-c"] == [T0]


def test_a_command_start_before_the_hold_moves_nothing_back(db: Database) -> None:
    with db.transaction() as s:
        s.add(_hold("job-a", T0 + 30))
    with db.transaction() as s:
        unbill_usage(s, "job-a", 5, until=at(10))  # a clock that stepped back: the hold never starts earlier
    assert _starts(db)["job-a"] == [T0 + 30]
