"""The reconcile loop under a burst, on SQLite and PostgreSQL: one write transaction per pass however many jobs
it starts, observes and moves, with admission, cancels and freed capacity handled inside that transaction; and a
real server killed in the middle of a burst.

The backend of the first tests is a fake (it starts no process; a test says where each attempt is), so what they
exercise is the loop and the database alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.backends.base import AttemptStatus, Backend, Inventory, Launch, Phase, Slot
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, JobEvent, Organization, Quota, UsageRecord, User
from kiln.domain.states import JobState
from kiln.scheduler import loop as loop_module
from kiln.scheduler.loop import MAX_LAUNCHES, Reconciler
from kiln.settings import Settings
from kiln.storage.logs import LogStore
from kiln.usecases.access.quotas import Admission
from kiln.usecases.jobs.lifecycle import ends_in_bulk, transition
from tests.helpers import log_text, spec, wait_for


class FakeBackend(Backend):
    """A FAKE executor: records starts, reports whatever phase the test set for each job."""

    name = "local"

    def __init__(self, cpus: float = 2.0) -> None:
        self.inv = Inventory(cpus=cpus, memory=64 * 1024**3, name="fake")
        self.started: list[tuple[str, int]] = []
        self.phase: dict[str, AttemptStatus] = {}
        self.cancelled: list[str] = []
        self.launch_ids: dict[str, str | None] = {}
        self.start_error: Exception | None = None  # what every start raises, when set

    def inventory(self) -> Inventory:
        return self.inv

    def handle_for(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"job_id": job_id, "attempt": attempt}

    def start(self, launch: Launch) -> dict[str, Any]:
        self.started.append((launch.job_id, launch.attempt))
        self.launch_ids[launch.job_id] = launch.launch_id
        if self.start_error is not None:
            raise self.start_error
        self.phase[launch.job_id] = AttemptStatus(Phase.STARTING)
        return self.handle_for(launch.job_id, launch.attempt)

    def poll(self, handle: dict[str, Any]) -> AttemptStatus:
        unlaunched = AttemptStatus(Phase.UNLAUNCHED, reason="NotLaunched", message="never launched")
        return self.phase.get(handle["job_id"], unlaunched)

    def cancel(self, handle: dict[str, Any], grace_seconds: float) -> None:
        self.cancelled.append(handle["job_id"])

    def collect_outputs(self, handle: dict[str, Any], dest_prefix: str, admit: Any = None) -> tuple[int, int]:
        return 0, 0

    def cleanup(self, handle: dict[str, Any]) -> None:
        pass


def running() -> AttemptStatus:
    return AttemptStatus(Phase.RUNNING, running_at=datetime.now(UTC))


def exited(code: int = 0) -> AttemptStatus:
    now = datetime.now(UTC)
    reason = "Completed" if code == 0 else "Error"
    return AttemptStatus(Phase.EXITED, exit_code=code, reason=reason, running_at=now, finished_at=now)


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


def add_jobs(db: Database, n: int, cpus: float = 0.01, prefix: str = "job") -> list[str]:
    ids = [f"{prefix}-{i:04d}" for i in range(n)]
    start = datetime.now(UTC) - timedelta(seconds=10)
    with db.transaction() as s:
        for i, job_id in enumerate(ids):
            spec = {"command": ["true"], "resources": {"cpus": cpus}}
            created = start + timedelta(milliseconds=i)
            s.add(
                Job(
                    id=job_id,
                    org_id="org-1",
                    user_id="usr-1",
                    name=job_id,
                    spec=spec,
                    state=JobState.QUEUED,
                    cpus=cpus,
                    created_at=created,
                    updated_at=created,
                )
            )
            s.add(JobEvent(job_id=job_id, time=created, to_state=JobState.QUEUED, reason="Submitted"))
    return ids


class Counted:
    """Counts the write transactions (``Database.transaction``) the reconciler opens."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = db.transaction

        def counting() -> AbstractContextManager[Session]:
            self.count += 1
            return original()

        monkeypatch.setattr(db, "transaction", counting)

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def states(db: Database) -> dict[str, str]:
    with db.read() as s:
        return {job_id: state for job_id, state in s.execute(select(Job.id, Job.state))}


def reconciler(db: Database, tmp_path: Path, backend: FakeBackend, instance: str = "server-a") -> Reconciler:
    settings = Settings(home=tmp_path / instance, instance_id=instance, reconcile_interval=0.5)
    return Reconciler(db, backend, LogStore(tmp_path / "logs"), settings)


def test_a_burst_is_started_and_finished_with_one_write_transaction_per_pass(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = add_jobs(db, 40)
    backend = FakeBackend()
    loop = reconciler(db, tmp_path, backend)
    admitted: list[float] = []
    loop.on_admitted = admitted.append
    writes = Counted(db, monkeypatch)
    passes = 0
    while any(state == "QUEUED" for state in states(db).values()):
        loop.run_once(full=passes == 0)
        passes += 1
        assert writes.take() == 1, "one transaction per pass: leases, waits, STARTING"
        assert passes < 10
    assert sorted(backend.started) == [(job_id, 1) for job_id in ids]  # each attempt started once
    assert passes <= 40 // 8  # a pass starts several placements, not one
    assert len(admitted) == 40 and all(0 <= seconds < 60 for seconds in admitted)

    for job_id in ids:
        backend.phase[job_id] = running()
        loop.wake(job_id)
    loop.run_once(full=False)
    assert writes.take() == 1
    assert set(states(db).values()) == {"RUNNING"}

    for job_id in ids:
        backend.phase[job_id] = exited(0)
        loop.wake(job_id)
    loop.run_once(full=False)
    assert writes.take() == 1
    assert set(states(db).values()) == {"SUCCEEDED"}
    with db.read() as s:
        moves = list(s.execute(select(JobEvent.from_state, JobEvent.to_state).where(JobEvent.job_id == ids[7])))
    assert [tuple(m) for m in moves] == [
        (None, "QUEUED"),
        ("QUEUED", "STARTING"),
        ("STARTING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]


def test_a_pass_woken_only_by_running_attempts_does_not_read_the_queue(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last step of submit → RUNNING: a shim says its command runs, and the pass that writes RUNNING decides
    no placement (nothing it depends on changed), so it does not read the queue; a pass woken for the queue, or
    one that sees an attempt end, does."""
    first, second, third = add_jobs(db, 3, cpus=1.0)  # two fit at once
    backend = FakeBackend(cpus=2.0)
    loop = reconciler(db, tmp_path, backend)
    loop.run_once()
    assert states(db) == {first: "STARTING", second: "STARTING", third: "QUEUED"}
    decided: list[set[str]] = []
    original = loop_module.gather

    def counting(s: Session, backend: Backend, now: datetime, released: Any = ()) -> Any:
        decided.append(set(released))
        return original(s, backend, now, released=released)

    monkeypatch.setattr(loop_module, "gather", counting)
    backend.phase[first] = running()
    loop.wake(first)
    loop.run_once(full=False)
    assert states(db)[first] == "RUNNING" and decided == []

    loop.wake()  # a submit, a cancel, a quota change: the queue is read
    loop.run_once(full=False)
    assert decided == [set()] and states(db)[third] == "QUEUED"

    backend.phase[first] = exited(0)  # an end frees a place: decided in the same pass
    loop.wake(first)
    loop.run_once(full=False)
    assert decided[-1] == {first} and states(db) == {first: "SUCCEEDED", second: "STARTING", third: "STARTING"}

    # A queued job cancelled (it is not active: nothing to observe) may have held others back: decided too.
    (fourth,) = add_jobs(db, 1, cpus=1.0, prefix="later")
    with db.transaction() as s:
        s.get(Job, fourth).state = JobState.CANCELLED  # type: ignore[union-attr]
    loop.wake(fourth)
    loop.run_once(full=False)
    assert len(decided) == 3


def test_an_attempt_seen_ending_frees_its_place_in_the_same_pass(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = add_jobs(db, 2, cpus=2.0)  # the machine holds one at a time
    backend = FakeBackend(cpus=2.0)
    loop = reconciler(db, tmp_path, backend)
    loop.run_once()
    assert states(db) == {first: "STARTING", second: "QUEUED"}
    backend.phase[first] = exited(0)  # it ran and ended between two passes
    writes = Counted(db, monkeypatch)
    loop.wake(first)
    loop.run_once(full=False)
    assert writes.take() == 1
    assert states(db) == {first: "SUCCEEDED", second: "STARTING"}
    assert backend.started == [(first, 1), (second, 1)]


def events_of(db: Database, job_id: str) -> list[str]:
    with db.read() as s:
        return list(s.scalars(select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def test_attempts_committed_starting_but_never_launched_are_launched_by_the_restarted_server(
    db: Database, tmp_path: Path
) -> None:
    """The server commits a pass's STARTING and dies before its starts: the restarted server's first pass
    launches each attempt (the same attempt, the launch its row recorded), says so, and claims no
    re-attachment; nothing fails."""
    ids = add_jobs(db, 6)
    backend = FakeBackend()
    dead = reconciler(db, tmp_path, backend)
    dead.starter.start = lambda launches, committed_at=None: None  # type: ignore[method-assign]  # killed after the commit
    dead.run_once()
    assert set(states(db).values()) == {"STARTING"} and backend.started == []
    restarted = reconciler(db, tmp_path, backend)
    restarted.run_once()
    assert sorted(backend.started) == [(job_id, 1) for job_id in ids]
    with db.read() as s:
        recorded = {row.id: (row.handle or {}).get("launch") for row in s.scalars(select(Job))}
    assert backend.launch_ids == recorded and all(recorded.values())
    for job_id in ids:
        reasons = events_of(db, job_id)
        assert "Relaunched" in reasons and "Reattached" not in reasons, reasons
        backend.phase[job_id] = exited(0)
    restarted.run_once()
    assert set(states(db).values()) == {"SUCCEEDED"}
    with db.read() as s:
        assert {row.attempt for row in s.scalars(select(Job))} == {1}


def test_a_server_paused_between_its_commit_and_its_starts_starts_nothing_another_took_over(
    db: Database, tmp_path: Path
) -> None:
    """Server A commits a pass's STARTING and is paused before its starts, past its leases; server B takes the
    jobs over and launches them. A, resumed, must start none of them: its starts are fenced by the job leases
    (looked at again, since its commit is long past). Before, A started every one of them a second time."""
    ids = add_jobs(db, 4)
    backend_a, backend_b = FakeBackend(), FakeBackend()
    paused = reconciler(db, tmp_path, backend_a, "server-a")
    held: list[Any] = []
    start = paused.starter.start
    paused.starter.start = lambda launches, committed_at=None: held.append((launches, committed_at))  # type: ignore[method-assign]
    paused.run_once()
    [(launches, committed_at)] = held
    assert len(launches) == 4 and set(states(db).values()) == {"STARTING"}
    with db.transaction() as s:  # the pause outlasts A's leases
        for row in s.scalars(select(Job)):
            row.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
    other = reconciler(db, tmp_path, backend_b, "server-b")
    other.run_once()
    assert sorted(backend_b.started) == [(job_id, 1) for job_id in ids]
    start(launches, committed_at=committed_at - 10)  # A resumes: its commit was 10 s ago
    assert backend_a.started == []
    # Right after its own commit A starts what it committed, without a look at the leases.
    fresh = add_jobs(db, 2, prefix="fresh")
    paused.starter.start = start  # type: ignore[method-assign]
    paused.run_once()
    assert sorted(backend_a.started) == [(job_id, 1) for job_id in fresh]


def test_a_start_that_keeps_raising_fails_the_job_after_max_launches(db: Database, tmp_path: Path) -> None:
    """A start that raises (not a refusal) is launched again by the next passes, not forever: after
    MAX_LAUNCHES the job fails with the reason, and no restart is spent on it."""
    (job_id,) = add_jobs(db, 1)
    backend = FakeBackend()
    backend.start_error = RuntimeError("the disk went away")
    loop = reconciler(db, tmp_path, backend)
    for _ in range(MAX_LAUNCHES + 2):
        loop.run_once()
    assert states(db) == {job_id: "FAILED"}
    assert backend.started == [(job_id, 1)] * MAX_LAUNCHES
    with db.read() as s:
        row = s.get(Job, job_id)
        assert row is not None and row.reason == "BackendError"
        assert f"could not be started in {MAX_LAUNCHES} launches" in (row.message or "")


def test_a_cancel_before_the_start_and_a_failure_are_written_with_the_rest(db: Database, tmp_path: Path) -> None:
    ids = add_jobs(db, 12)
    backend = FakeBackend()
    loop = reconciler(db, tmp_path, backend)
    loop.run_once()
    started = {job_id for job_id, _ in backend.started}
    waiting = [job_id for job_id in ids if job_id not in started]
    assert waiting, "a pass starts its share of the placements, the next pass the rest"
    with db.transaction() as s:  # cancelled after the decision, before its start: never started
        row = s.get(Job, waiting[0])
        assert row is not None
        row.cancel_requested = True
    failing = sorted(started)[0]
    backend.phase[failing] = exited(3)
    loop.wake(failing)
    loop.run_once(full=False)
    final = states(db)
    assert final[waiting[0]] == "CANCELLED" and (waiting[0], 1) not in backend.started
    assert final[failing] == "FAILED"
    with db.read() as s:
        row = s.get(Job, failing)
        assert row is not None and row.exit_code == 3 and row.lease_owner is None


def placed_at_submit(db: Database, loop: Reconciler, job_id: str) -> Launch:
    """What a submit that places its job does (kiln.scheduler.submit_placement): STARTING under the loop's lease in
    the submit's transaction, the attempt marked as being launched before the commit; the launch to hand over."""
    with db.transaction() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.lease_owner = loop.owner
        job.lease_expires_at = datetime.now(UTC) + timedelta(seconds=60)
        launch = loop.starting(s, job, (Slot("fake", 0.01, None, ()),), datetime.now(UTC))
        loop.launching(job.id, job.attempt)
    return launch


def test_an_attempt_a_submit_placed_is_started_by_its_hand_over_once(db: Database, tmp_path: Path) -> None:
    """A pass that observes an attempt a submit committed STARTING and has not handed over yet (a full sweep that
    read it between the two) finds it never launched: it leaves it to the hand-over, which starts it once, and
    nothing says Relaunched. Before, such passes launched about a third of a 100-job burst a second time."""
    (job_id,) = add_jobs(db, 1)
    backend = FakeBackend()
    loop = reconciler(db, tmp_path, backend)
    launch = placed_at_submit(db, loop, job_id)
    loop.run_once(full=True)
    assert backend.started == [] and states(db) == {job_id: "STARTING"}
    loop.hand_over(launch)
    loop.run_once(full=False)
    assert backend.started == [(job_id, 1)]
    loop.run_once(full=True)  # started: seen starting, nothing to launch
    backend.phase[job_id] = exited(0)
    loop.wake(job_id)
    loop.run_once(full=False)
    assert states(db) == {job_id: "SUCCEEDED"} and backend.started == [(job_id, 1)]
    assert "Relaunched" not in events_of(db, job_id)


def test_an_attempt_whose_hand_over_never_comes_is_launched_by_a_later_pass(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark lasts ``LAUNCHING_SECONDS``: an attempt marked and never handed over (its start lost) is launched
    by the first pass after it, as after a crash between a commit and its start."""
    (job_id,) = add_jobs(db, 1)
    backend = FakeBackend()
    loop = reconciler(db, tmp_path, backend)
    placed_at_submit(db, loop, job_id)
    loop.run_once(full=True)
    assert backend.started == []
    monkeypatch.setattr(loop_module, "LAUNCHING_SECONDS", 0.0)
    loop.run_once(full=True)
    assert backend.started == [(job_id, 1)] and "Relaunched" in events_of(db, job_id)


def test_usage_holds_closed_in_bulk_are_closed_before_the_job_holds_again(db: Database) -> None:
    """Inside ``ends_in_bulk`` a close is written when the block ends, but before the same job opens its next hold
    in the block (a restart placed in the same pass): each hold is closed once, at its own end."""
    (job_id,) = add_jobs(db, 1)
    allocation = {"cpus": 0.01, "memory": None, "gpus": [], "slots": []}
    with db.transaction() as s, ends_in_bulk(s):
        job = s.get(Job, job_id)
        assert job is not None
        t0 = datetime.now(UTC)
        job.allocation = dict(allocation)
        transition(s, job, JobState.STARTING, "Scheduled", now=t0)
        transition(s, job, JobState.RUNNING, "Started", now=t0 + timedelta(seconds=1))
        transition(s, job, JobState.RESTARTING, "Restart", now=t0 + timedelta(seconds=2))
        job.attempt += 1
        job.allocation = dict(allocation)
        transition(s, job, JobState.STARTING, "Scheduled", now=t0 + timedelta(seconds=3))
        transition(s, job, JobState.RUNNING, "Started", now=t0 + timedelta(seconds=4))
        transition(s, job, JobState.SUCCEEDED, "Completed", now=t0 + timedelta(seconds=5))
    with db.read() as s:
        holds = [(r.start_ts - t0.timestamp(), r.end_ts - t0.timestamp()) for r in s.scalars(select(UsageRecord))]
    assert sorted(holds) == [(0.0, 2.0), (3.0, 5.0)]


def test_admission_counts_each_job_it_admits(db: Database) -> None:
    """The jobs of one pass are admitted against their organisation's quota in order, each counted."""
    ids = add_jobs(db, 3)
    with db.transaction() as s:
        s.add(Quota(org_id="org-1", category="train", count=2))
    with db.transaction() as s:
        admission = Admission(s, db.dialect, ["org-1", "org-1"])
        jobs = [s.get(Job, job_id) for job_id in ids]
        answers = [admission.admit(job, "acme") for job in jobs if job is not None]
    assert answers[:2] == [None, None]
    assert answers[2] is not None and "count" in answers[2]


def test_kill9_in_the_middle_of_a_burst_runs_no_job_twice_and_ends_every_one(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real server killed while it starts a burst: after the restart every job ends in its first attempt
    (one committed STARTING whose start the kill prevented is launched by the restarted server, not failed:
    no restart is allowed here), each job's command ran once."""
    server = make_server(home=tmp_path / "home")
    client = server.client()
    job = spec(["python", "-c", "print('ran', flush=True)"], resources={"cpus": 0.01}, max_restarts=0)
    ids = [client.submit(job).id for _ in range(30)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # kill once some have started and some have not
        started = [j for j in client.list_jobs(limit=100) if j.state != "QUEUED"]
        if len(started) >= 5:
            break
        time.sleep(0.02)
    server.kill()
    client = make_server(home=server.home).client()
    for job_id in ids:
        done = wait_for(client, job_id, timeout=90)
        assert (done.state, done.attempt) == ("SUCCEEDED", 1), (done.reason, done.message)
        assert log_text(client, job_id) == ["ran"], f"job {job_id} (attempt {done.attempt})"
