"""What the scheduler reads and writes at its edge, on SQLite and PostgreSQL: a service's replica is named by its
service, what a backfilled job borrowed is kept with its allocation and read back, and CPUs become whole
millicores, so a quota of 10 CPUs holds exactly a hundred jobs of 0.1.

The backend here is a fake (it starts no process; the test says where each attempt is): what is exercised is the
snapshot (services.scheduler_inputs), the loop's writes and the quota arithmetic on a real database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kiln.backends.base import AttemptStatus, Backend, Inventory, Launch, Phase, Slot
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, Organization, Quota, Service, User
from kiln.domain.states import JobState
from kiln.scheduler.loop import Reconciler
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.usecases.access.quotas import Admission, load_usage
from kiln.usecases.jobs.scheduler_inputs import allocation_of, gather

ENDLESS, BIG, SMALL = "job-000000000endless", "job-0000000000000big", "job-00000000000small"


class FakeBackend(Backend):
    """A FAKE executor of two CPUs: records starts, reports whatever phase the test set for each job."""

    name = "local"

    def __init__(self) -> None:
        self.phase: dict[str, AttemptStatus] = {}

    def inventory(self) -> Inventory:
        return Inventory(cpus=2.0, memory=8 * 1024**3, name="fake")

    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"job_id": job_id, "attempt": attempt}

    def start(self, launch: Launch) -> dict[str, Any]:
        self.phase[launch.job_id] = AttemptStatus(Phase.RUNNING, running_at=datetime.now(UTC))
        return self.handle_for(launch.job_id, launch.attempt)

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        return self.phase.get(handle["job_id"], AttemptStatus(Phase.RUNNING, running_at=datetime.now(UTC)))

    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        self.phase[handle["job_id"]] = AttemptStatus(Phase.EXITED, exit_code=143, reason="Cancelled")

    def cleanup(self, handle: dict[str, Any]) -> None:
        pass


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


def add_job(
    db: Database, job_id: str, cpus: float, state: JobState = JobState.QUEUED, age: float = 10, **spec: Any
) -> None:
    created = datetime.now(UTC) - timedelta(seconds=age)
    active = state in (JobState.STARTING, JobState.RUNNING)
    allocation = allocation_of((Slot("fake", cpus, None, ()),))
    with db.transaction() as s:
        s.add(
            Job(
                id=job_id,
                org_id="org-1",
                user_id="usr-1",
                name=job_id,
                spec={"command": ["true"], "resources": {"cpus": cpus}, **spec},
                state=state,
                cpus=cpus,
                category=spec.get("category", "train"),
                created_at=created,
                updated_at=created,
                attempt=1 if active else 0,
                allocation=allocation if active else None,
                handle={"job_id": job_id, "attempt": 1} if active else None,
                started_at=created if active else None,
                running_at=created if state == JobState.RUNNING else None,
            )
        )


def test_a_replica_is_named_by_its_service(db: Database) -> None:
    with db.transaction() as s:
        s.add(
            Service(
                id="svc-1",
                org_id="org-1",
                user_id="usr-1",
                name="web",
                spec={},
                state="READY",
                model_name="digits",
                model_version=1,
                desired_replicas=1,
            )
        )
    add_job(db, ENDLESS, 0.5, JobState.RUNNING, labels={"kiln-service": "svc-1", "kiln-replica": "rep-1"})
    add_job(db, "job-00000000000other", 0.5, JobState.RUNNING, labels={"team": "a"})
    add_job(db, BIG, 2)
    with db.read() as s:
        snap = gather(s, FakeBackend(), datetime.now(UTC))
    assert {r.job_id: r.service for r in snap.running} == {ENDLESS: "web", "job-00000000000other": None}
    assert [w.millicores for r in snap.running for w in r.workers] == [500, 500]
    message = snap.decide(datetime.now(UTC).timestamp(), True).waiting[BIG].message
    assert f"{ENDLESS} (a replica of service web: scale the service down or stop it)" in message


def test_the_loop_keeps_what_a_backfilled_job_borrowed_and_takes_it_back(db: Database, tmp_path: Path) -> None:
    backend = FakeBackend()
    add_job(db, ENDLESS, 0.5, JobState.RUNNING, age=20)
    add_job(db, BIG, 2, age=10)
    add_job(db, SMALL, 1, age=5)
    settings = Settings(home=tmp_path / "home", instance_id="server-a", preemption=True)
    loop = Reconciler(db, backend, LogStore(tmp_path / "logs"), settings)
    loop.run_once()
    with db.read() as s:
        small, big = s.get(Job, SMALL), s.get(Job, BIG)
        assert small is not None and big is not None
        assert small.state == JobState.STARTING, small.message
        assert small.allocation is not None and small.allocation["backfill_for"] == BIG
        assert big.state == JobState.QUEUED and big.message is not None
        assert f"{ENDLESS} (no timeout: wait for it to end or cancel it)" in big.message
    with db.read() as s:
        snap = gather(s, backend, datetime.now(UTC))
    assert {r.job_id: r.backfill_for for r in snap.running} == {ENDLESS: None, SMALL: BIG}

    # The endless job ends: big preempts what small borrowed (small is not failed: it is queued again).
    backend.phase[ENDLESS] = AttemptStatus(
        Phase.EXITED, exit_code=0, reason="Completed", running_at=datetime.now(UTC), finished_at=datetime.now(UTC)
    )
    loop.run_once()
    loop.run_once()
    with db.read() as s:
        small = s.get(Job, SMALL)
        assert small is not None
        assert small.preempt_reason == (
            f"preempted by {BIG}: this job had backfilled on resources reserved for it, which it can use now"
        )


def test_a_hundred_tenth_cpu_jobs_fill_a_ten_cpu_quota_exactly(db: Database) -> None:
    with db.transaction() as s:
        s.add(Quota(org_id="org-1", category="total", cpus=10.0))
    for i in range(99):
        add_job(db, f"job-{i:016d}", 0.1, JobState.RUNNING)
    add_job(db, "job-000000000000last", 0.1)
    add_job(db, "job-000000000000more", 0.1)
    with db.read() as s:
        assert load_usage(s)["org-1"].total.millicores == 9900
    with db.transaction() as s:
        admission = Admission(s, db.dialect, ["org-1"])
        last, more = s.get(Job, "job-000000000000last"), s.get(Job, "job-000000000000more")
        assert last is not None and more is not None
        assert admission.admit(last, "acme") is None  # the hundredth fits exactly
        assert admission.admit(more, "acme") == "quota: cpus 10 of 10 in use (org acme, category total)"
