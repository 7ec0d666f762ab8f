"""The database layer on SQLite and PostgreSQL: migrations, the transition function, leases."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select

from kiln.backends.local.executor import LocalBackend
from kiln.backends.local.runtimes import RuntimeManager
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, JobEvent, Organization, User, utcnow
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.states import JobState
from kiln.errors import IllegalTransition
from kiln.scheduler.loop import Reconciler
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore
from kiln.usecases.jobs.lifecycle import transition


@pytest.fixture
def db(database_url: str):
    database = Database(database_url)
    migrate.upgrade(database.engine)
    yield database
    database.dispose()


def _job(db: Database, job_id: str = "job-1", state: JobState = JobState.QUEUED) -> None:
    with db.transaction() as s:
        if s.get(Organization, "org-1") is None:
            s.add(Organization(id="org-1", name="acme"))
            s.flush()
            s.add(User(id="usr-1", org_id="org-1", name="ann"))
            s.flush()
        s.add(Job(id=job_id, org_id="org-1", user_id="usr-1", name="n", spec={"command": "true"}, state=state))


def test_migrations_apply_from_empty_and_are_idempotent(db: Database):
    assert migrate.is_up_to_date(db.engine)
    tables = set(inspect(db.engine).get_table_names())
    assert {"jobs", "job_events", "organizations", "users", "access_keys", "nonces", "blobs"} <= tables
    migrate.upgrade(db.engine)  # a second start changes nothing
    assert migrate.current_revision(db.engine) == migrate.head_revision()


def test_transition_writes_state_times_and_event_atomically(db: Database):
    _job(db)
    with db.transaction() as s:
        job = s.get(Job, "job-1")
        assert job is not None
        transition(s, job, JobState.STARTING, "Scheduled", "placed")
    with db.transaction() as s:
        job = s.get(Job, "job-1")
        assert job is not None and job.state == JobState.STARTING and job.started_at is not None
        events = list(s.scalars(select(JobEvent).where(JobEvent.job_id == "job-1")))
        assert [(e.from_state, e.to_state, e.reason) for e in events] == [("QUEUED", "STARTING", "Scheduled")]
        assert job.started_at.tzinfo is not None


def test_illegal_transition_raises_and_writes_nothing(db: Database):
    _job(db)
    with pytest.raises(IllegalTransition), db.transaction() as s:
        job = s.get(Job, "job-1")
        assert job is not None
        transition(s, job, JobState.SUCCEEDED, "Completed")
    with db.transaction() as s:
        job = s.get(Job, "job-1")
        assert job is not None and job.state == JobState.QUEUED
        assert s.scalar(select(func.count()).select_from(JobEvent)) == 0


def _reconciler(db: Database, home: Path, owner: str) -> Reconciler:
    settings = Settings(home=home, instance_id=owner, cpus=0.5)
    store = ObjectStore(str(home / "store"))
    logs = LogStore(home / "logs")
    backend = LocalBackend(settings, store, logs, RuntimeManager(DEFAULT_CATALOG, home / "runtimes"))
    return Reconciler(db, backend, logs, settings)


def test_a_job_is_leased_by_one_reconciler_at_a_time(db: Database, tmp_path: Path):
    for i in range(5):
        _job(db, f"job-{i}")
    first = _reconciler(db, tmp_path / "a", "server-a")
    second = _reconciler(db, tmp_path / "b", "server-b")
    try:
        mine = {j.id for j in first._claim()}
        theirs = {j.id for j in second._claim()}
        assert mine == {f"job-{i}" for i in range(5)}
        assert theirs == set()
        # An expired lease is taken over.
        with db.transaction() as s:
            for job in s.scalars(select(Job)):
                job.lease_expires_at = utcnow()
        assert {j.id for j in second._claim()} == mine
        assert {j.id for j in first._claim()} == set()
    finally:  # the backends' spare network namespaces stay mounted under tmp_path otherwise
        for reconciler in (first, second):
            reconciler.backend.close()
