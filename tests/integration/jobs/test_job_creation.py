"""usecases.lifecycle.create_job: a new job enters the state machine with its first event, on SQLite and
PostgreSQL, the way every submit and rerun creates one."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, JobEvent, Organization, User
from kiln.errors import IllegalTransition
from kiln.usecases.jobs.lifecycle import create_job


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database.engine)
    with database.transaction() as s:
        s.add(Organization(id="org-1", name="acme"))
        s.flush()
        s.add(User(id="usr-1", org_id="org-1", name="ann"))
    yield database
    database.dispose()


def _new(job_id: str = "job-1", **fields: object) -> Job:
    return Job(id=job_id, org_id="org-1", user_id="usr-1", name="n", spec={"command": "true"}, **fields)


def test_create_job_writes_the_queued_row_and_its_first_event(db: Database) -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    with db.transaction() as s:
        event = create_job(s, _new(), "submitted by ann", now=now)
        assert event.to_state == "QUEUED"
    with db.read() as s:
        job = s.get(Job, "job-1")
        assert job is not None
        assert (job.state, job.reason, job.message) == ("QUEUED", "Submitted", "")
        assert job.created_at == job.updated_at and job.created_at.replace(tzinfo=UTC) == now
        assert job.attempt == 0 and job.restarts == 0 and job.started_at is None and job.finished_at is None
        events = list(s.scalars(select(JobEvent).where(JobEvent.job_id == "job-1")))
    assert [(e.from_state, e.to_state, e.reason, e.message) for e in events] == [
        (None, "QUEUED", "Submitted", "submitted by ann")
    ]


def test_create_job_refuses_a_row_that_has_a_state(db: Database) -> None:
    with db.transaction() as s, pytest.raises(IllegalTransition, match="job job-2: already RUNNING"):
        create_job(s, _new("job-2", state="RUNNING"), "submitted by ann")
    with db.read() as s:
        assert s.get(Job, "job-2") is None
        assert list(s.scalars(select(JobEvent))) == []
