"""Every leased task's writes and backend calls are fenced: a server whose run stalled past the task's lease (a
paused process, SIGSTOP beyond the TTL, then SIGCONT) and resumed after another server took the lease writes
nothing and calls no backend, on SQLite and PostgreSQL.

One shared fixture builds a real server's parts (``Platform``) on a real database and a second server's handle
on its leases. Each scenario seeds work for one leased task (and may let this server lead a run first, so that the
stalled run resumes with warm caches, as a paused leader does); then the lease expires, the other server takes it,
and this server's run with its old token must stop with ``LeaseLost`` leaving every table (Optuna's too) as it
was and the backend untouched. The new holder's run of the same task then does change the database (or call the
backend): the work was there, so the refusal was the fence's. Every task with a lease scope that the server
registers must have a scenario here: a new leased task without one fails ``test_every_leased_task_has_a_scenario``.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import MetaData, create_engine, select
from sqlalchemy.engine import Engine

from kiln.backends.base import Backend
from kiln.backends.capabilities import DeployTrack, ServiceAddress, ServiceDeployer
from kiln.db.session import Database
from kiln.db.tables import (
    AuditEvent,
    Budget,
    IdempotencyKey,
    Job,
    MetricSeries,
    Nonce,
    NotificationDelivery,
    NotificationEvent,
    NotificationSubscription,
    Organization,
    Service,
    ServiceReplica,
    TuningStudy,
    UsageRecord,
    User,
    utcnow,
)
from kiln.domain.ids import new_id
from kiln.domain.rollout import VersionStats
from kiln.domain.serving import ServiceSpec
from kiln.domain.spec import JobSpec
from kiln.domain.studies import StudySpec
from kiln.platform import Platform
from kiln.routing.router import Endpoint, Router
from kiln.settings import Settings
from kiln.tasks.leases import TaskLeases
from kiln.tasks.runner import LeaseLost, Task, TaskContext
from kiln.tasks.serving import ServingControl
from kiln.usecases.tuning.tuning_engine import storage_location

Run = Callable[[TaskContext], object]


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class FakeDeployer(ServiceDeployer):
    """A backend that deploys services itself (as Kubernetes does), recording every call (a fake: no cluster)."""

    name = "fake-deployer"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def apply_service(self, service_id: str, *args: Any, track: DeployTrack = "stable") -> ServiceAddress:
        self.calls.append(f"apply {service_id} {track}")
        return ServiceAddress(f"http://127.0.0.1:9/{service_id}/{track}", "secret")

    def service_ready(self, service_id: str, track: DeployTrack = "stable") -> int:
        self.calls.append(f"ready {service_id} {track}")
        return 1

    def delete_service(self, service_id: str, track: DeployTrack | None = None) -> None:
        self.calls.append(f"delete {service_id} {track or 'everything'}")


@dataclass
class World:
    """A server (``server-a``) whose runs stall, a second server's leases (``server-b``) and the database."""

    platform: Platform
    other: TaskLeases
    home: Path
    org_id: str = ""
    user_id: str = ""
    deployer: FakeDeployer = field(default_factory=FakeDeployer)
    closers: list[Callable[[], object]] = field(default_factory=list)

    @property
    def db(self) -> Database:
        return self.platform.db

    def task(self, name: str) -> Task:
        (task,) = [t for t in self.platform.tasks.tasks() if t.name == name]
        return task

    def leading(self, task: Task) -> TaskContext:
        """This server's context for a run while it holds the task's lease."""
        leases = self.platform.tasks.leases
        assert leases is not None and task.lease_scope is not None
        held = leases.acquire(task.lease_scope, 60)
        assert held is not None, "this server leads before it stalls"
        return TaskContext(task.name, held.token, False, threading.Event(), leases, task.lease_scope)

    def stalled(self, task: Task) -> TaskContext:
        """What the runner handed this server's run before it stalled: a token whose lease expired meanwhile and
        which the other server has taken since (with the next token)."""
        leases = self.platform.tasks.leases
        assert leases is not None and task.lease_scope is not None
        held = leases.acquire(task.lease_scope, 0.2)
        assert held is not None
        until(lambda: utcnow() > held.expires_at)  # the stall outlasts the lease
        taken = self.other.acquire(task.lease_scope, 60)
        assert taken is not None and taken.token > held.token
        return TaskContext(task.name, held.token, False, threading.Event(), leases, task.lease_scope)

    def new_holder(self, task: Task) -> TaskContext:
        """The other server's context for its run, with the lease it took."""
        assert task.lease_scope is not None
        held = self.other.acquire(task.lease_scope, 60)
        assert held is not None
        return TaskContext(task.name, held.token, False, threading.Event(), self.other, task.lease_scope)

    def snapshot(self) -> dict[str, list[str]]:
        """Every row of every table but the leases', and of Optuna's storage where it is a file of its own."""
        rows = _rows(self.db.engine, "")
        url, _ = storage_location(self.db.url, self.home)
        if url.startswith("sqlite:///") and Path(url.removeprefix("sqlite:///")).exists():
            engine = create_engine(url)
            try:
                rows |= _rows(engine, "optuna.")
            finally:
                engine.dispose()
        return rows


def _rows(engine: Engine, prefix: str) -> dict[str, list[str]]:
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        return {
            prefix + table.name: sorted(repr(tuple(row)) for row in conn.execute(select(table)))
            for table in meta.sorted_tables
            if table.name != "task_leases"
        }


@pytest.fixture
def world(database_url: str, tmp_path: Path) -> Iterator[World]:
    home = tmp_path / "home"
    platform = Platform(Settings(home=home, database_url=database_url, instance_id="server-a"))
    other_db = Database(database_url)
    try:
        platform.identity.bootstrap()
        with platform.db.read() as s:
            org = s.scalars(select(Organization)).one()
            user = s.scalars(select(User)).one()
        world = World(platform, TaskLeases(other_db, "server-b"), home, org.id, user.id)
        yield world
        for close in world.closers:
            close()
    finally:
        other_db.dispose()
        platform.close()


# ---- the scenarios: each seeds work for its task and answers the run to make --------------------------------


def purge_nonces(world: World) -> Run:
    with world.db.transaction() as s:
        s.add(Nonce(key_id="AKOLD", nonce="n1", seen_at=utcnow() - timedelta(days=2)))
    return world.task("purge-nonces").run_once


def purge_audit(world: World) -> Run:
    with world.db.transaction() as s:
        s.add(AuditEvent(time=utcnow() - timedelta(days=3650), action="submit_job", outcome="success", status=201))
    return world.task("purge-audit").run_once


def purge_idempotency_keys(world: World) -> Run:
    with world.db.transaction() as s:
        s.add(
            IdempotencyKey(
                org_id=world.org_id,
                user_id=world.user_id,
                key="old",
                method="POST",
                path="/api/v1/jobs",
                fingerprint="0" * 64,
                resource_kind="job",
                resource_id="job-old",
                created_at=utcnow() - timedelta(days=30),
            )
        )
    return world.task("purge-idempotency-keys").run_once


def _study(world: World) -> str:
    spec = StudySpec.model_validate(
        {
            "trial": {"command": ["python", "-c", "pass"], "runtime": {"python": sys.executable}},
            "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
            "objective": {"metric": "score", "direction": "maximize"},
            "algorithm": "random",
            "max_trials": 3,
            "seed": 1,
        }
    )
    study_id = new_id("study")
    with world.db.transaction() as s:
        s.add(
            TuningStudy(
                id=study_id,
                org_id=world.org_id,
                user_id=world.user_id,
                name="fenced",
                spec=spec.model_dump(mode="json"),
                state="RUNNING",
                message="",
                planned_trials=spec.planned_trials,
            )
        )
    return study_id


def studies_first_pass(world: World) -> Run:
    """A new study: the stalled run would create its Optuna study and its first trial."""
    _study(world)
    return world.task("studies").run_once


def studies_trial_ended(world: World) -> Run:
    """This server led the study (its Optuna study loaded, a trial started), then the trial's job failed: the
    stalled run would end the trial, tell Optuna and start the next one."""
    _study(world)
    task = world.task("studies")
    task.run_once(world.leading(task))
    with world.db.transaction() as s:
        (job,) = s.scalars(select(Job)).all()
        job.state, job.reason, job.finished_at = "FAILED", "Error", utcnow()
    return task.run_once


def _service(world: World, name: str, state: str = "DEPLOYING", replicas: int = 1) -> str:
    spec = ServiceSpec.model_validate({"name": name, "model": "m@1", "predictor": {"type": "sklearn"}})
    service_id = new_id("svc")
    with world.db.transaction() as s:
        s.add(
            Service(
                id=service_id,
                org_id=world.org_id,
                user_id=world.user_id,
                name=name,
                spec=spec.model_dump(mode="json", by_alias=True),
                state=state,
                message="",
                model_name="m",
                model_version=1,
                desired_replicas=replicas,
            )
        )
    return service_id


def serving_starts_a_replica(world: World) -> Run:
    _service(world, "wants-one")
    return world.task("serving").run_once


def serving_stops_and_deletes(world: World) -> Run:
    """This server led: the service's replica was started; then the service was deleted."""
    service_id = _service(world, "goes")
    task = world.task("serving")
    task.run_once(world.leading(task))
    with world.db.transaction() as s:
        row = s.get(Service, service_id)
        assert row is not None
        row.state = "DELETING"
    return task.run_once


def serving_replica_failed(world: World) -> Run:
    """This server led: a replica was started; then its job failed before it was ever ready."""
    _service(world, "fails")
    task = world.task("serving")
    task.run_once(world.leading(task))
    with world.db.transaction() as s:
        (job,) = s.scalars(select(Job)).all()
        job.state, job.reason, job.finished_at = "FAILED", "Error", utcnow()
    return task.run_once


def serving_records_requests(world: World) -> Run:
    """The router forwarded a request to a ready replica: the stalled run would write its metrics (then the
    service's state, which the new holder writes)."""
    service_id = _service(world, "busy", state="IDLE")
    spec = JobSpec.model_validate({"command": ["python", "-c", "pass"], "runtime": {"python": sys.executable}})
    with world.db.transaction() as s:
        job = world.platform.jobs.new_job(s, world.org_id, world.user_id, spec, None, "a replica")
        s.flush()
        s.add(
            ServiceReplica(
                id="rep-busy",
                service_id=service_id,
                job_id=job.id,
                revision=1,
                model_version=1,
                state="READY",
                message="",
                ready_at=utcnow(),
            )
        )
    endpoint = Endpoint("rep-busy", job.id, str(world.home / "nowhere.sock"), "s", "m@1")
    world.platform.router.add(service_id, endpoint)
    endpoint.requests, endpoint.latencies = 1, [0.01]  # as the router counts a forwarded predict
    return world.task("serving").run_once


def serving_rolls_back_a_canary(world: World) -> Run:
    """This server led while a canary with a rollout policy ran (its step's figures began then); then half of the
    canary's predicts failed: the stalled run would roll the canary back, with its event and notification."""
    service_id = _service(world, "guarded", state="READY")
    with world.db.transaction() as s:
        row = s.get(Service, service_id)
        assert row is not None
        row.canary_version, row.canary_weight, row.canary_step_at = 2, 50, utcnow()
        row.canary_policy = {"max_error_rate": 0.05, "min_requests": 5}
    task = world.task("serving")
    task.run_once(world.leading(task))
    failing = VersionStats()
    for i in range(10):
        failing.observe(0.01, i % 2 == 0, time.monotonic())
    world.platform.router._versions[(service_id, 2)] = failing  # as the router counts forwarded predicts
    return task.run_once


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        conn, _ = self.socket.accept()
        return conn, ("replica", 0)  # BaseHTTPRequestHandler wants a (host, port) client address


def _replica_answering(world: World, service_id: str, replica_id: str, state: str) -> None:
    """A replica row (``state``) whose running job's work dir has the replica's state file and a socket that
    answers /healthz, as kiln.injob.serve leaves them once its model loaded."""
    spec = JobSpec.model_validate({"command": ["python", "-c", "pass"], "runtime": {"python": sys.executable}})
    with world.db.transaction() as s:
        job = world.platform.jobs.new_job(s, world.org_id, world.user_id, spec, None, "a replica")
        job.state = "RUNNING"
        s.flush()
        s.add(
            ServiceReplica(
                id=replica_id,
                service_id=service_id,
                job_id=job.id,
                revision=1,
                model_version=1,
                state=state,
                message="",
                ready_at=utcnow() if state == "READY" else None,
            )
        )
    work = world.home / "jobs" / job.id / "work"
    work.mkdir(parents=True)
    (work / ".kiln-replica.json").write_text(json.dumps({"socket": "r.sock", "secret": "s"}))
    work_fd = os.open(work, os.O_PATH | os.O_DIRECTORY)  # a short name for the socket's path, of any length
    try:
        server = _UnixHTTPServer(f"/proc/self/fd/{work_fd}/r.sock", _Healthy)
    finally:
        os.close(work_fd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    world.closers += [server.shutdown, server.server_close]


def serving_replica_ready(world: World) -> Run:
    """A replica's job runs and its socket answers: the stalled run would mark it READY and record where every
    server reaches it."""
    service_id = _service(world, "getting-ready")
    _replica_answering(world, service_id, "rep-ready", "STARTING")
    return world.task("serving").run_once


def serving_records_a_route(world: World) -> Run:
    """A READY replica whose row records no route (made ready before routes were recorded), after a restart:
    the stalled run would record it."""
    service_id = _service(world, "unrecorded")
    _replica_answering(world, service_id, "rep-unrecorded", "READY")
    return world.task("serving").run_once


def _deployed_control(world: World) -> ServingControl:
    return ServingControl(
        world.db,
        world.platform.jobs,
        Router(),
        world.platform.logs,
        None,
        cast(Backend, world.deployer),
        box=world.platform.box,  # the address is recorded for every server's router
    )


def serving_deployed_applies(world: World) -> Run:
    """A backend that deploys services itself: the stalled run would apply the service to it."""
    _service(world, "deployed")
    return _deployed_control(world).run_once


def serving_deployed_deletes(world: World) -> Run:
    """This server led and applied the service; then the service was deleted: the stalled run would delete it
    from the backend and its row."""
    service_id = _service(world, "deployed")
    control = _deployed_control(world)
    control.run_once(world.leading(world.task("serving")))
    assert world.deployer.calls
    with world.db.transaction() as s:
        row = s.get(Service, service_id)
        assert row is not None
        row.state = "DELETING"
    return control.run_once


def serving_deployed_canary(world: World) -> Run:
    """This server led and applied a deployed service; then a canary began: the stalled run would apply the
    canary's own deployment and record where every server routes it."""
    service_id = _service(world, "deployed")
    control = _deployed_control(world)
    control.run_once(world.leading(world.task("serving")))
    with world.db.transaction() as s:
        row = s.get(Service, service_id)
        assert row is not None
        row.canary_version, row.canary_weight, row.canary_replicas = 2, 10, 1

    def run(ctx: TaskContext) -> None:
        control.run_once(ctx)
        assert f"apply {service_id} canary" in world.deployer.calls  # the new holder's did

    return run


def serving_deployed_canary_rolled_back(world: World) -> Run:
    """This server led while a deployed service's canary ran (applied, routed, its route recorded); then it was
    rolled back: the stalled run would take its route off the row and delete its deployment."""
    service_id = _service(world, "deployed")
    with world.db.transaction() as s:
        row = s.get(Service, service_id)
        assert row is not None
        row.canary_version, row.canary_weight, row.canary_replicas = 2, 10, 1
    control = _deployed_control(world)
    control.run_once(world.leading(world.task("serving")))
    assert f"apply {service_id} canary" in world.deployer.calls
    with world.db.transaction() as s:
        row = s.get(Service, service_id)
        assert row is not None and row.route_tracks and "canary" in row.route_tracks
        row.canary_version, row.canary_weight = None, 0

    def run(ctx: TaskContext) -> None:
        control.run_once(ctx)
        assert f"delete {service_id} canary" in world.deployer.calls  # the new holder's did

    return run


def _pipeline_principal(world: World) -> Any:
    from kiln.usecases.pipelines import run_principal

    with world.db.read() as s:
        return run_principal(s, world.user_id, "the fenced scenario")


FENCED_PIPELINE = {
    "name": "fenced",
    "steps": {"one": {"command": ["python", "-c", "pass"], "runtime": {"python": sys.executable}}},
}


def pipelines_start_a_step(world: World) -> Run:
    """A running pipeline run whose first step waits: the stalled run would create its job."""
    from kiln.domain.spec import JobSpec
    from kiln.usecases.pipelines import new_run

    principal = _pipeline_principal(world)
    checked = {"one": JobSpec.model_validate(FENCED_PIPELINE["steps"]["one"]).model_dump(mode="json")}  # type: ignore[index]
    with world.db.transaction() as s:
        new_run(s, principal, "fenced", FENCED_PIPELINE, checked, None, True)
    return world.task("pipelines").run_once


def pipelines_due_schedule(world: World) -> Run:
    """A schedule whose time has passed: the stalled run would start its run and move its next time."""
    from kiln.db.tables import PipelineSchedule

    with world.db.transaction() as s:
        s.add(
            PipelineSchedule(
                id=new_id("psch"),
                org_id=world.org_id,
                user_id=world.user_id,
                name="fenced",
                spec=FENCED_PIPELINE,
                use_cache=True,
                cron="0 3 * * *",
                next_at=utcnow() - timedelta(hours=1),
                message="",
            )
        )
    return world.task("pipelines").run_once


def usage_settles_a_hold(world: World) -> Run:
    """A hold that ended a moment ago, whose job's CPU-seconds arrived since: the task writes them on the hold."""
    now = time.time()
    with world.db.transaction() as s:
        s.add(
            UsageRecord(
                org_id=world.org_id,
                user_id=world.user_id,
                job_id="job-settled",
                attempt=1,
                category="train",
                cpus=2.0,
                start_ts=now - 20,
                end_ts=now - 10,
            )
        )
        s.add(
            MetricSeries(
                job_id="job-settled",
                worker="worker0",
                name="system/cpu_seconds",
                kind="scalar",
                source="sys",
                axis="time",
                count=1,
                last_time=now - 11,
                last_value=9.5,
            )
        )
    return world.task("usage").run_once


def usage_rolls_a_settled_hold(world: World) -> Run:
    """A hold that ended an hour ago, settled: the task adds it into usage_hours."""
    now = time.time()
    with world.db.transaction() as s:
        s.add(
            UsageRecord(
                org_id=world.org_id,
                user_id=world.user_id,
                job_id="job-settled-long-ago",
                attempt=1,
                category="train",
                cpus=1.0,
                start_ts=now - 7200,
                end_ts=now - 3600,
            )
        )
    return world.task("usage").run_once


def usage_stops_running_work(world: World) -> Run:
    """A budget that stops running work, spent (a zero hard limit), and a job of its scope waiting."""
    spec = JobSpec.model_validate({"command": ["true"], "runtime": {"python": sys.executable}})
    with world.db.transaction() as s:
        world.platform.jobs.new_job(s, world.org_id, world.user_id, spec, None, "queued")
        s.add(Budget(id="bud-spent", org_id=world.org_id, hard=0.0, stop_running=True, created_by=world.user_id))
    return world.task("usage").run_once


def _notification(world: World, fanned: bool) -> str:
    """A subscription to failed jobs at a target the platform refuses (loopback: nothing is ever sent) and one
    event of it; returns the event's id."""
    event_id = new_id("evt")
    body = {"id": event_id, "type": "job.failed", "org_id": world.org_id, "subject": {"kind": "job", "id": "job-x"}}
    with world.db.transaction() as s:
        s.add(
            NotificationSubscription(
                id="sub-fenced",
                org_id=world.org_id,
                user_id=world.user_id,
                name="fenced",
                events=["job.failed"],
                channel="webhook",
                target="http://127.0.0.1:9/hook",
            )
        )
        s.add(NotificationEvent(id=event_id, org_id=world.org_id, type="job.failed", body=body, fanned=fanned))
    return event_id


def notifications_fans_out(world: World) -> Run:
    """A new event: the stalled run would make its deliveries."""
    _notification(world, fanned=False)
    return world.task("notifications").run_once


def notifications_sends_a_due_delivery(world: World) -> Run:
    """A delivery due: the stalled run must not send it (the fence comes before any attempt) nor record one."""
    event_id = _notification(world, fanned=True)
    with world.db.transaction() as s:
        s.add(
            NotificationDelivery(
                id="dlv-fenced",
                event_id=event_id,
                event_type="job.failed",
                org_id=world.org_id,
                subscription_id="sub-fenced",
                channel="webhook",
                target="http://127.0.0.1:9/hook",
                status="pending",
                attempts=0,
                next_at=utcnow() - timedelta(seconds=1),
            )
        )
    return world.task("notifications").run_once


SCENARIOS: dict[str, dict[str, Callable[[World], Run]]] = {
    "usage": {
        "a hold ended lately": usage_settles_a_hold,
        "a settled hold": usage_rolls_a_settled_hold,
        "a spent budget stops work": usage_stops_running_work,
    },
    "purge-nonces": {"old nonce": purge_nonces},
    "purge-audit": {"old audit event": purge_audit},
    "purge-idempotency-keys": {"expired key": purge_idempotency_keys},
    "notifications": {"a new event": notifications_fans_out, "a due delivery": notifications_sends_a_due_delivery},
    "studies": {"first pass": studies_first_pass, "a trial's job ended": studies_trial_ended},
    "pipelines": {"a step to start": pipelines_start_a_step, "a due schedule": pipelines_due_schedule},
    "serving": {
        "start a replica": serving_starts_a_replica,
        "stop and delete": serving_stops_and_deletes,
        "a replica failed": serving_replica_failed,
        "record requests": serving_records_requests,
        "roll a canary back": serving_rolls_back_a_canary,
        "a replica got ready": serving_replica_ready,
        "record a ready replica's route": serving_records_a_route,
        "deployed: apply": serving_deployed_applies,
        "deployed: delete": serving_deployed_deletes,
        "deployed: a canary": serving_deployed_canary,
        "deployed: a canary rolled back": serving_deployed_canary_rolled_back,
    },
}
CASES = [(task, label) for task, scenarios in SCENARIOS.items() for label in scenarios]


@pytest.mark.parametrize(("task_name", "label"), CASES, ids=[f"{t}: {label}" for t, label in CASES])
def test_a_stalled_leader_writes_nothing_and_calls_no_backend(world: World, task_name: str, label: str) -> None:
    run = SCENARIOS[task_name][label](world)
    task = world.task(task_name)
    calls = list(world.deployer.calls)
    before = world.snapshot()

    with pytest.raises(LeaseLost):
        run(world.stalled(task))
    assert world.snapshot() == before, "the stalled leader's run wrote nothing"
    assert world.deployer.calls == calls, "... and called no backend"

    run(world.new_holder(task))  # the new holder does the work that was there
    after = world.snapshot()
    changed = sorted(name for name in after if after[name] != before.get(name))
    assert changed or world.deployer.calls != calls, "the scenario left no work: it would prove nothing"


def test_every_leased_task_has_a_scenario(world: World) -> None:
    leased = {task.name for task in world.platform.tasks.tasks() if task.lease_scope is not None}
    assert leased == set(SCENARIOS), "a leased task needs a scenario in SCENARIOS (or one left must go)"
