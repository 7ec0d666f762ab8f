"""A waiting job whose lease another server holds is placed by this one as soon as that lease runs out (issue 27:
the holder died). Only the holder places a job, so the others must look again when its lease ends: the reconcile
task asks for its next pass then, not an interval later (``Reconciler.until_takeover``). Every job taken over says
so in its events, naming both servers (issue 44: nothing said who ran a job when). On SQLite and PostgreSQL, with a
fake backend (no process): what is exercised is the loop and its leases."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from kiln.db.session import Database
from kiln.db.tables import Job, JobEvent
from kiln.domain.states import JobState
from kiln.scheduler.loop import TAKEOVER_SLACK_SECONDS, Reconciler
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.tasks.runner import TaskContext
from tests.helpers import acme_database
from tests.integration.jobs.test_reconcile_batch import FakeBackend, add_jobs, running

INTERVAL = 30.0  # far longer than the lease left: a pass an interval later would be far too late
LEFT = 3.0  # the dead holder's lease left: more than a pass takes on a loaded machine


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = acme_database(database_url)
    yield database
    database.dispose()


def survivor(db: Database, tmp_path: Path, backend: FakeBackend | None = None) -> Reconciler:
    settings = Settings(home=tmp_path / "home", instance_id="server-b", reconcile_interval=INTERVAL)
    return Reconciler(db, backend or FakeBackend(), LogStore(tmp_path / "logs"), settings)


def takeovers(db: Database) -> dict[str, list[str]]:
    """Each job's TakenOver events' messages."""
    with db.read() as s:
        rows = s.execute(
            select(JobEvent.job_id, JobEvent.message).where(JobEvent.reason == "TakenOver").order_by(JobEvent.id)
        ).all()
    found: dict[str, list[str]] = {}
    for job_id, message in rows:
        found.setdefault(job_id, []).append(message)
    return found


def lease(db: Database, job_id: str, owner: str, seconds: float) -> datetime:
    expires = datetime.now(UTC) + timedelta(seconds=seconds)
    with db.transaction() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.lease_owner, job.lease_expires_at = owner, expires
    return expires


def a_pass(reconciler: Reconciler) -> float | None:
    """One run of the reconcile task, as its runner makes it after an interval (not woken); the delay it asks for."""
    return reconciler.task().run_once(TaskContext("reconciler", None, False, threading.Event()))


def test_a_dead_servers_waiting_job_is_placed_once_its_lease_ran_out_not_an_interval_later(
    db: Database, tmp_path: Path
) -> None:
    (job_id,) = add_jobs(db, 1)
    expires = lease(db, job_id, "server-a", LEFT)  # server-a holds it and died: nobody renews it
    b = survivor(db, tmp_path)
    delay = a_pass(b)
    with db.read() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == JobState.QUEUED and job.lease_owner == "server-a"
    assert delay is not None, "the survivor waits its whole interval before it looks again"
    assert 0 < delay <= LEFT + TAKEOVER_SLACK_SECONDS
    time.sleep(delay)  # what the runner waits
    while datetime.now(UTC) <= expires:  # the runner's wait may end a little early
        time.sleep(0.01)
    assert a_pass(b) is None  # nothing else held by another server: back to the interval
    with db.read() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == JobState.STARTING and job.lease_owner == "server-b"
    assert takeovers(db) == {job_id: ["Adopted by server-b after server-a stopped renewing"]}


def test_a_lease_that_outlasts_the_interval_changes_nothing(db: Database, tmp_path: Path) -> None:
    (job_id,) = add_jobs(db, 1)
    lease(db, job_id, "server-a", INTERVAL * 2)  # a live holder renews long before: the interval applies
    assert a_pass(survivor(db, tmp_path)) is None


def test_every_job_taken_over_says_by_whom_after_whom_and_no_other_does(db: Database, tmp_path: Path) -> None:
    """A running job and a waiting one of a dead server-a are taken over by server-b; a job live server-c holds,
    a new job nobody held and server-b's own job whose lease it renews say nothing of the kind."""
    dead_running, dead_waiting, others, new, own = add_jobs(db, 5)
    with db.transaction() as s:
        job = s.get(Job, dead_running)
        assert job is not None
        job.state, job.attempt, job.handle = JobState.RUNNING, 1, {"job_id": dead_running, "attempt": 1}
        job.allocation = {"cpus": 0.01, "memory": None, "gpus": []}
    for job_id in (dead_running, dead_waiting):
        lease(db, job_id, "server-a", -5)  # ran out: server-a died (SIGKILL) 5 s ago
    lease(db, others, "server-c", 60)
    lease(db, own, "server-b", -1)  # server-b's own, run out: taken back, no takeover
    backend = FakeBackend()
    backend.phase[dead_running] = running()  # its supervisor runs on: adopted as it is
    b = survivor(db, tmp_path, backend)
    a_pass(b)
    a_pass(b)  # renewing what it took is no takeover
    said = "Adopted by server-b after server-a stopped renewing"
    assert takeovers(db) == {dead_running: [said], dead_waiting: [said]}
    with db.read() as s:
        owners = {job_id: s.get(Job, job_id).lease_owner for job_id in (dead_running, dead_waiting, others, new, own)}  # type: ignore[union-attr]
        assert s.get(Job, dead_running).state == JobState.RUNNING  # type: ignore[union-attr]
    assert owners == {
        dead_running: "server-b",
        dead_waiting: "server-b",
        others: "server-c",
        new: "server-b",
        own: "server-b",
    }
