"""The ``serving`` task: keeps every service's replicas as its spec and load want them.

Each run, for each service:

1. **Observe** its replicas. A replica is a job of quota category ``serve`` (placed by the scheduler, run by the
   backend's shim, with its log and metrics). Once its job runs and its state file (its Unix socket's name in the
   job's work dir and its secret, written by ``kiln.injob.serve`` after the model loaded) names a socket that
   answers ``/healthz``, it is READY and the router sends it requests over that socket (the job has its own network
   namespace: no port of its is reachable from here, nor open to other jobs); a replica whose job ended is FAILED
   (the loader's error, from its job's log, in its message) and the router forgets it.
2. **Scale**: with ``autoscale``, the wanted count follows the requests in flight (``target_concurrency`` per
   replica, between min and max; to zero after ``idle_seconds`` without requests when min is 0).
3. **Converge**: start replicas up to the wanted count; a new revision (another model version or spec) is rolled
   out one replica at a time — a new replica is READY before an old one drains (maxSurge 1, maxUnavailable 0); a
   draining replica gets no new requests and its job is cancelled once its last request ended. Replicas that keep
   failing before they ever get ready are started again with a growing back-off, and the service is DEGRADED.
   A canary (another model version with a share of the predicts: kiln.domain.traffic_split) runs its own
   replicas beside these, flagged in their rows; promoting it makes them replicas of the new stable revision. A
   canary with a rollout policy is advanced, promoted or rolled back by it (kiln.tasks.serving_rollout).
4. **Record** what the router forwarded per replica (requests, errors, latency percentiles, batch sizes) as metric
   points of the replica's job, in the metrics store.

Every write goes through the run's fenced transaction (``ctx.transaction()``), and the replica statistics are
recorded only after ``ctx.fence()``: a server that stalled past the task's lease and resumed after another took it
starts, stops and marks no replica.

A backend that runs a service's replicas itself (a :class:`~kiln.backends.capabilities.ServiceDeployer`:
Kubernetes) has no replica jobs: there each service is applied to it, routed and its state told by
:class:`kiln.tasks.serving_deployed.DeployedServices` instead.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from kiln.auth.secrets import SecretBox
from kiln.backends.base import Backend
from kiln.backends.capabilities import ServiceDeployer, WorkDirs
from kiln.db.session import Database
from kiln.db.tables import Job, Service, ServiceReplica, ServiceTraffic, utcnow
from kiln.domain.ids import new_id
from kiln.domain.serving import ReplicaState, ServiceSpec, ServiceState
from kiln.domain.states import JobState
from kiln.metrics.parse import parse_lines
from kiln.routing.replica_http import healthy
from kiln.routing.router import Endpoint, Router
from kiln.storage.logs import LogStore
from kiln.tasks.runner import Task, TaskContext
from kiln.tasks.serving_deployed import DeployedServices
from kiln.tasks.serving_rollout import Rollouts
from kiln.tasks.serving_routes import Traffic, this_node
from kiln.usecases.jobs.jobs import JobService, request_cancel
from kiln.usecases.models.serving import ACTIVE_REPLICAS, CATEGORY, replica_spec
from kiln.usecases.notifications import notification_events

log = logging.getLogger(__name__)

INTERVAL = 0.5
STATE_FILE = ".kiln-replica.json"
MAX_BACKOFF = 60.0
SCALE_DOWN_WINDOW = 30.0


@dataclass
class _Replica:
    row: ServiceReplica
    job: Job | None


class ServingControl:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        router: Router,
        logs: LogStore,
        record_metrics: Callable[[str, bytes], object] | None = None,
        backend: Backend | None = None,
        box: SecretBox | None = None,
        remote_traffic: Callable[[], dict[str, Traffic]] | None = None,
        node: str | None = None,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.router = router
        self.logs = logs
        # Where a replica job's files are, to read the state file naming its socket (the local executor's).
        self.work_dirs = backend if isinstance(backend, WorkDirs) else None
        self.record_metrics = record_metrics  # (job id, spool lines) → stored in the metrics store
        # Where a ready replica is reached is recorded in its row for every server's router (serving_routes): its
        # secret sealed with this box (None: not recorded, only this server's router routes to it).
        self.box = box
        self.node = node or this_node()
        self.remote_traffic = remote_traffic  # the other live servers' traffic per service, summed
        self._remote: dict[str, Traffic] = {}
        # One server at a time runs the replicas (and routes to them: its router is the one that knows them); two
        # servers on one database would otherwise both start every replica.
        self._task = Task("serving", self.run_once, INTERVAL, lease_scope="serving")
        self._failures: dict[str, tuple[int, float]] = {}  # service id → (failures in a row, not before)
        self._load_samples: dict[str, list[tuple[float, int]]] = {}  # service id → (time, requests in flight)
        self._started = time.monotonic()
        self.rollouts = Rollouts(router)  # canaries' rollout policies: advance, promote, roll back
        # The backend runs the replicas itself (Kubernetes): none of the replica jobs below.
        self._deployed = (
            DeployedServices(db, backend, router, backend.name, box, self.rollouts, self._in_flight)
            if isinstance(backend, ServiceDeployer)
            else None
        )

    def task(self) -> Task:
        return self._task

    def wake(self) -> None:
        self._task.wake.set()

    def run_once(self, ctx: TaskContext) -> None:
        with self.db.read() as s:
            ids = list(s.scalars(select(Service.id)))
        self._remote = self.remote_traffic() if self.remote_traffic is not None and ids else {}
        for service_id in ids:
            if ctx.stopping.is_set():
                return
            if self._deployed is not None:
                self._deployed.drive(ctx, service_id, self._remote.get(service_id, Traffic()).versions)
            else:
                self._drive(ctx, service_id)

    def _load(self, service_id: str) -> tuple[Service, list[_Replica]] | None:
        with self.db.read() as s:
            service = s.get(Service, service_id)
            if service is None:
                return None
            rows = s.execute(
                select(ServiceReplica, Job)
                .outerjoin(Job, Job.id == ServiceReplica.job_id)
                .where(
                    ServiceReplica.service_id == service_id,
                    ServiceReplica.state.in_([str(x) for x in ACTIVE_REPLICAS]),
                )
                .order_by(ServiceReplica.created_at)
            )
            replicas = [_Replica(r, j) for r, j in rows]
            s.expunge_all()
        return service, replicas

    def _drive(self, ctx: TaskContext, service_id: str) -> None:
        loaded = self._load(service_id)
        if loaded is None:
            return
        service, replicas = loaded
        self._observe(ctx, service, replicas)
        self._record(ctx, service)
        self.rollouts.drive(ctx, service, self._remote.get(service.id, Traffic()).versions)
        loaded = self._load(service_id)
        assert loaded is not None
        service, replicas = loaded
        if service.state == ServiceState.DELETING:
            self._delete(ctx, service, replicas)
            return
        self._autoscale(ctx, service, replicas)
        self._converge(ctx, service, replicas)
        self._update_state(ctx, service_id)

    # ---- 1. observe

    def _observe(self, ctx: TaskContext, service: Service, replicas: list[_Replica]) -> None:
        for replica in replicas:
            row, job = replica.row, replica.job
            if job is None or JobState(job.state).terminal:
                why = self._failure(job) if job is not None else "its job was deleted"
                ended = ReplicaState.STOPPED if row.state == ReplicaState.DRAINING else ReplicaState.FAILED
                self._set(ctx, row.id, ended, why)
                self.router.remove(service.id, row.id)
                if ended is ReplicaState.FAILED and row.ready_at is None:
                    count, _ = self._failures.get(service.id, (0, 0.0))
                    delay = min(MAX_BACKOFF, 2.0**count)
                    self._failures[service.id] = (count + 1, time.monotonic() + delay)
                continue
            if row.state == ReplicaState.STARTING and job.state == JobState.RUNNING:
                endpoint = self._probe(service, row, job)
                if endpoint is not None:
                    where = os.path.basename(endpoint.socket or "")
                    self._set(
                        ctx, row.id, ReplicaState.READY, f"serving {endpoint.model} on its socket {where}", endpoint
                    )
                    # Routed once its row says where (every server's routes follow the rows: one routed first and
                    # then read before the row was written would be dropped again).
                    self.router.add(service.id, endpoint)
                    self._failures.pop(service.id, None)
            elif row.state == ReplicaState.READY:
                self._ensure_routed(ctx, service, row, job)

    def _work_dir(self, job: Job) -> Path | None:
        """The replica job's work dir, from the backend (None: its jobs' files are not on this machine)."""
        return self.work_dirs.work_dir(job.id, job.handle) if self.work_dirs is not None else None

    def _state_file(self, job: Job) -> dict[str, Any] | None:
        work = self._work_dir(job)
        if work is None:
            return None
        try:
            data = json.loads((work / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        name = data.get("socket")  # a file name in the work dir: the job wrote it, so nothing that leaves the dir
        if not isinstance(name, str) or not name or "/" in name or "\x00" in name or name in (".", ".."):
            return None
        return data

    def _probe(self, service: Service, row: ServiceReplica, job: Job) -> Endpoint | None:
        state, work = self._state_file(job), self._work_dir(job)
        if state is None or work is None:
            return None
        path = os.path.abspath(work / state["socket"])  # as every server names it
        endpoint = Endpoint(
            row.id,
            job.id,
            path,
            str(state.get("secret", "")),
            f"{service.model_name}@{row.model_version}",
            canary=row.canary,
            shadow=row.shadow,
        )
        return endpoint if healthy(path, endpoint.secret, timeout=2.0) else None

    def _ensure_routed(self, ctx: TaskContext, service: Service, row: ServiceReplica, job: Job) -> None:
        """After a server restart the router knows no replica its row does not record the route of (one made
        ready before routes were recorded): a READY one is probed, routed again, and its route recorded."""
        if row.id in self.router.ready(service.id):
            return
        endpoint = self._probe(service, row, job)
        if endpoint is not None:
            if row.socket != endpoint.socket and self.box is not None:
                with ctx.transaction() as s:
                    current = s.get(ServiceReplica, row.id)
                    if current is not None and current.state == ReplicaState.READY:
                        current.socket, current.node = endpoint.socket, self.node
                        current.secret = self.box.seal(endpoint.secret)
            self.router.add(service.id, endpoint)

    def _failure(self, job: Job) -> str:
        """Why a replica's job ended: the replica server's own last words (a model that did not load), else
        the job's message."""
        try:
            tail = self.logs.path(job.id).read_bytes()[-8192:].decode("utf-8", "replace").splitlines()
        except OSError:
            tail = []
        for line in reversed(tail):
            if "kiln serve:" in line:
                return line[line.index("kiln serve:") :][:1000]
        return f"its job {job.state.lower()}: {job.reason}: {job.message}"[:1000]

    def _set(
        self, ctx: TaskContext, replica_id: str, state: ReplicaState, message: str, endpoint: Endpoint | None = None
    ) -> None:
        with ctx.transaction() as s:
            row = s.get(ServiceReplica, replica_id)
            if row is None:
                return
            row.state = state
            row.message = message
            if state is ReplicaState.READY:
                row.ready_at = utcnow()
            if endpoint is not None and endpoint.socket is not None and self.box is not None:
                # Where every server reaches it: the socket's path on this machine, the secret sealed.
                row.socket, row.secret, row.node = endpoint.socket, self.box.seal(endpoint.secret), self.node
            if state in (ReplicaState.FAILED, ReplicaState.STOPPED):
                row.ended_at = utcnow()

    # ---- 2. scale

    def _autoscale(self, ctx: TaskContext, service: Service, replicas: list[_Replica]) -> None:
        """Replicas for the requests in flight: the peak of the last SCALE_DOWN_WINDOW seconds (a lull does
        not drop replicas a burst will need again); zero only after idle_seconds without a request."""
        scale = ServiceSpec.model_validate(service.spec).autoscale
        if scale is None:
            return
        now = time.monotonic()
        samples = self._load_samples.setdefault(service.id, [])
        remote = self._remote.get(service.id, Traffic())
        samples.append((now, self.router.in_flight(service.id) + remote.in_flight))
        samples[:] = [(t, n) for t, n in samples if now - t <= SCALE_DOWN_WINDOW]
        peak = max(n for _, n in samples)
        # The last request through any live server (and a cold start's, recorded on the service), as seconds ago.
        ages = [now - last] if (last := self.router.last_request.get(service.id)) is not None else []
        for at in (remote.last_request_at, service.last_request_at):
            if at is not None:
                ages.append((utcnow() - at).total_seconds())
        idle = not ages or min(ages) > scale.idle_seconds
        want = math.ceil(peak / scale.target_concurrency) if peak else (0 if idle else 1)
        want = max(scale.min, min(scale.max, want))
        if want != service.desired_replicas:
            with ctx.transaction() as s:
                row = s.get(Service, service.id)
                if row is not None and row.state != ServiceState.DELETING:
                    row.desired_replicas = want
            service.desired_replicas = want

    # ---- 3. converge

    def _converge(self, ctx: TaskContext, service: Service, everything: list[_Replica]) -> None:
        """The stable version's replicas (a rolling update among them), then the canary's."""
        replicas = [r for r in everything if not r.row.canary and not r.row.shadow]
        self._converge_canary(ctx, service, [r for r in everything if r.row.canary])
        self._converge_shadow(ctx, service, [r for r in everything if r.row.shadow])
        desired = service.desired_replicas
        current = [r for r in replicas if r.row.revision == service.revision and r.row.state != ReplicaState.DRAINING]
        old = [r for r in replicas if r.row.revision != service.revision and r.row.state != ReplicaState.DRAINING]
        draining = [r for r in everything if r.row.state == ReplicaState.DRAINING]  # the canary's too
        count, not_before = self._failures.get(service.id, (0, 0.0))
        may_start = time.monotonic() >= not_before
        if not old:
            if len(current) < desired and may_start:
                for _ in range(desired - len(current) if count == 0 else 1):
                    self._start(ctx, service)
            elif len(current) > desired:
                extra = sorted(current, key=lambda r: (r.row.state == ReplicaState.READY, r.row.created_at))
                for replica in extra[: len(current) - desired]:
                    self._drain(ctx, service, replica)
        else:  # a rolling update: one new replica at a time, an old one drained for each new one ready
            starting = [r for r in current if r.row.state == ReplicaState.STARTING]
            ready_new = [r for r in current if r.row.state == ReplicaState.READY]
            if len(current) < desired and not starting and may_start:
                self._start(ctx, service)
            for replica in [r for r in old if r.row.state == ReplicaState.STARTING]:
                self._drain(ctx, service, replica)  # never got ready: nothing to keep
            ready_old = [r for r in old if r.row.state == ReplicaState.READY]
            surplus = len(ready_new) + len(ready_old) - desired
            for replica in sorted(ready_old, key=lambda r: r.row.created_at)[: max(0, surplus)]:
                self._drain(ctx, service, replica)
        for replica in draining:
            if self._in_flight(service.id, replica.row.id) == 0:
                self._stop(ctx, service, replica)

    def _converge_canary(self, ctx: TaskContext, service: Service, replicas: list[_Replica]) -> None:
        """``canary_replicas`` of the canary version while there is a canary; a replica of another version (a
        replaced canary) or of a rolled-back one drains. Its draining replicas stop with the stable ones'."""
        live = [r for r in replicas if r.row.state != ReplicaState.DRAINING]
        keep = [r for r in live if r.row.model_version == service.canary_version]
        for replica in live:
            if replica not in keep:
                self._drain(ctx, service, replica)
        want = service.canary_replicas if service.canary_version is not None else 0
        _, not_before = self._failures.get(service.id, (0, 0.0))
        if len(keep) < want and time.monotonic() >= not_before:
            self._start(ctx, service, canary=True)
        extra = sorted(keep, key=lambda r: (r.row.state == ReplicaState.READY, r.row.created_at))
        for replica in extra[: max(0, len(keep) - want)]:
            self._drain(ctx, service, replica)

    def _converge_shadow(self, ctx: TaskContext, service: Service, replicas: list[_Replica]) -> None:
        """One replica of the shadow version while there is a shadow; one of another version drains."""
        live = [r for r in replicas if r.row.state != ReplicaState.DRAINING]
        keep = [r for r in live if r.row.model_version == service.shadow_version]
        for replica in live:
            if replica not in keep:
                self._drain(ctx, service, replica)
        want = 1 if service.shadow_version is not None else 0
        _, not_before = self._failures.get(service.id, (0, 0.0))
        if len(keep) < want and time.monotonic() >= not_before:
            self._start(ctx, service, shadow=True)
        for replica in sorted(keep, key=lambda r: r.row.created_at)[want:]:
            self._drain(ctx, service, replica)

    def _start(self, ctx: TaskContext, service: Service, *, canary: bool = False, shadow: bool = False) -> None:
        spec = ServiceSpec.model_validate(service.spec)
        replica_id = new_id("rep")
        version = service.canary_version if canary and service.canary_version is not None else service.model_version
        if shadow and service.shadow_version is not None:
            version = service.shadow_version
        role = "canary " if canary else "shadow " if shadow else ""
        job_spec = replica_spec(spec, service.id, replica_id, service.model_name, version)
        with ctx.transaction() as s:
            job = self.jobs.new_job(
                s,
                service.org_id,
                service.user_id,
                job_spec,
                service.code_sha256,
                f"{role}replica {replica_id} of service {service.name} (revision {service.revision})",
                category=CATEGORY,
            )
            s.flush()
            s.add(
                ServiceReplica(
                    id=replica_id,
                    service_id=service.id,
                    job_id=job.id,
                    revision=service.revision,
                    model_version=version,
                    canary=canary,
                    shadow=shadow,
                    state=ReplicaState.STARTING,
                    message="",
                    created_at=utcnow(),
                )
            )
        self.jobs.wake()

    def _drain(self, ctx: TaskContext, service: Service, replica: _Replica) -> None:
        self.router.drain(service.id, replica.row.id)
        self._set(ctx, replica.row.id, ReplicaState.DRAINING, "draining: no new requests")
        replica.row.state = ReplicaState.DRAINING
        if self._in_flight(service.id, replica.row.id) == 0:
            self._stop(ctx, service, replica)

    def _in_flight(self, service_id: str, replica_id: str) -> int:
        """Requests in flight on a replica, through this server and (as they last wrote them) the others."""
        remote = self._remote.get(service_id, Traffic()).replica_in_flight or {}
        return self.router.in_flight(service_id, replica_id) + int(remote.get(replica_id, 0))

    def _stop(self, ctx: TaskContext, service: Service, replica: _Replica) -> None:
        with ctx.transaction() as s:
            row = s.get(ServiceReplica, replica.row.id)
            job = s.get(Job, replica.row.job_id) if replica.row.job_id else None
            if row is not None:
                row.state = ReplicaState.STOPPED
                row.ended_at = utcnow()
                row.message = row.message or "stopped"
            if job is not None:
                request_cancel(s, job, f"cancelled: replica {replica.row.id} of service {service.name} stopped")
        self.router.remove(service.id, replica.row.id)  # after its row says so: no server routes it back
        self.jobs.wake()

    def _delete(self, ctx: TaskContext, service: Service, replicas: list[_Replica]) -> None:
        for replica in replicas:
            self._stop(ctx, service, replica)
        self.router.forget(service.id)
        self._failures.pop(service.id, None)
        with ctx.transaction() as s:
            row = s.get(Service, service.id)
            if row is not None:
                s.execute(delete(ServiceTraffic).where(ServiceTraffic.service_id == service.id))
                s.delete(row)

    # ---- the service's state

    def _update_state(self, ctx: TaskContext, service_id: str) -> None:
        loaded = self._load(service_id)
        if loaded is None:
            return
        service, replicas = loaded
        # the stable version's tell the service's state
        replicas = [r for r in replicas if not r.row.canary and not r.row.shadow]
        current = [r for r in replicas if r.row.revision == service.revision]
        old = [r for r in replicas if r.row.revision != service.revision and r.row.state != ReplicaState.DRAINING]
        ready = sum(r.row.state == ReplicaState.READY for r in current)
        count, _ = self._failures.get(service_id, (0, 0.0))
        message = ""
        if service.desired_replicas == 0 and not replicas:
            state = ServiceState.IDLE
        elif old:
            state = ServiceState.UPDATING
            message = f"rolling out revision {service.revision}: {ready} of {service.desired_replicas} new ready"
            if count:
                message += f"; {self._last_failure(service_id)}"
        elif ready >= service.desired_replicas:
            state = ServiceState.READY
        elif count:
            state = ServiceState.DEGRADED
            message = self._last_failure(service_id)
        else:
            state = ServiceState.DEPLOYING
        if state != service.state or (message and message != service.message):
            with ctx.transaction() as s:
                row = s.get(Service, service_id)
                if row is not None and row.state != ServiceState.DELETING:
                    was, row.state = row.state, state
                    row.message = message
                    row.updated_at = utcnow()
                    notification_events.service_state_changed(s, row, was)  # unhealthy, recovered

    def _last_failure(self, service_id: str) -> str:
        with self.db.read() as s:
            row = s.scalars(
                select(ServiceReplica)
                .where(ServiceReplica.service_id == service_id, ServiceReplica.state == ReplicaState.FAILED)
                .order_by(ServiceReplica.ended_at.desc())
                .limit(1)
            ).first()
            return f"replica {row.id} failed: {row.message}" if row is not None else ""

    # ---- 4. record

    def _record(self, ctx: TaskContext, service: Service) -> None:
        if self.record_metrics is None:
            return
        stats = {k: v for k, v in self.router.take_stats(service.id).items() if v[0]}
        if not stats:
            return
        ctx.fence()  # the metrics store writes in a transaction of its own
        for replica_id, (requests, errors, latencies, batches) in stats.items():
            job_id = next((e["job_id"] for e in self._replica_jobs(service.id) if e["id"] == replica_id), None)
            if job_id is None:
                continue
            ordered = sorted(latencies)
            metrics: dict[str, float] = {
                "requests": float(requests),
                "errors": float(errors),
                "latency_p50_ms": 1000 * ordered[len(ordered) // 2] if ordered else 0.0,
                "latency_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0,
            }
            if batches:
                metrics["batch_size"] = sum(batches) / len(batches)
            line = {"t": time.time(), "s": int(time.monotonic() - self._started), "w": "router", "m": metrics}
            self.record_metrics(job_id, (json.dumps(line) + "\n").encode())

    def _replica_jobs(self, service_id: str) -> list[dict[str, Any]]:
        with self.db.read() as s:
            return [
                {"id": r.id, "job_id": r.job_id}
                for r in s.scalars(select(ServiceReplica).where(ServiceReplica.service_id == service_id))
            ]


def spool_writer(store: Any) -> Callable[[str, bytes], object]:
    """Write spool-format lines for a job into the metrics store (the replica's request metrics)."""

    def write(job_id: str, lines: bytes) -> object:
        return store.write([(job_id, parse_lines(lines), False)])

    return write
