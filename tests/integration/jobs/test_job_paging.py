"""Paging through the job list with ``before`` returns every job exactly once, on SQLite and PostgreSQL, even
when ids do not follow the creation order (jobs made in the same instant by different processes): the console
scrolling through 10,000 jobs found ten never shown and others shown twice when paging compared ids alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kiln.db import migrate
from kiln.db.session import Database
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService
from tests.helpers import seed_jobs

SPEC = {"spec": {"command": "true"}}


def test_paging_returns_every_job_once(database_url: str) -> None:
    db = Database(database_url)
    migrate.upgrade(db.engine)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # 60 jobs in 12 instants of 5; within an instant the ids are in no particular order against the times.
    jobs = {
        f"job-{(i * 37) % 60:03d}": {"created_at": start + timedelta(seconds=i // 5), "updated_at": start, **SPEC}
        for i in range(60)
    }
    seed_jobs(db, "org-p", "usr-p", jobs)
    seed_jobs(db, "org-q", "usr-q", {"job-zzz": {"created_at": start, "updated_at": start, **SPEC}})
    service = JobService(db, DEFAULT_CATALOG, lambda: [], lambda *_: None)
    caller = Principal("usr-p", "pat", "org-p", "org-p", "AK1", "member", False)
    seen: list[str] = []
    before = None
    while True:
        page = service.list_jobs(caller, limit=7, before=before)
        if not page:
            break
        seen += [job.id for job in page]
        before = page[-1].id
    assert sorted(seen) == sorted(jobs) and len(seen) == len(set(seen))
    times = [jobs[j]["created_at"] for j in seen]
    assert times == sorted(times, reverse=True)  # newest first, as the list is sorted
    # A job the caller does not see (another organisation's) pages like one that does not exist: nothing.
    assert service.list_jobs(caller, before="job-zzz") == service.list_jobs(caller, before="job-nope") == []
    db.dispose()
