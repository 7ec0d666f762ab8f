"""The reconcile loop: leases the jobs it works on, observes attempts through the backend, applies the
placement decision, and moves jobs through ``transition``. It keeps no state the database does not have, so a
restarted server picks up exactly where the last one stopped (re-attaching to running attempts)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session

from kiln.backends.base import AttemptStatus, Backend, Launch, Phase
from kiln.db.models import Job, Organization, utcnow
from kiln.db.session import Database
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason
from kiln.errors import BackendError
from kiln.scheduler.placement import Held, Request, decide
from kiln.services.blobs import blob_key
from kiln.services.lifecycle import record, transition
from kiln.services.quotas import admit, load_limits, load_usage
from kiln.settings import Settings
from kiln.storage.logs import LogStore

log = logging.getLogger(__name__)

MAX_START_SECONDS_PER_PASS = 0.05
OPEN_STATES = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING]
# Failures that a retry cannot fix: the spec itself is wrong.
PERMANENT_REASONS = {Reason.COMMAND_NOT_FOUND, Reason.RUNTIME_ERROR, Reason.CODE_ERROR}


def set_waiting(s: Session, job: Job, why: str) -> None:
    """Say why a job waits. An event only when the kind of wait changes (queued → capacity → quota): a moving
    queue position or changing free numbers just update the message, so a long queue does not flood events."""
    before = (job.message or "").split(":", 1)[0]
    job.message = why
    if before != why.split(":", 1)[0]:
        record(s, job, "Waiting", why)


def outputs_prefix(org_id: str, job_id: str) -> str:
    return f"orgs/{org_id}/jobs/{job_id}/outputs"


class Reconciler:
    def __init__(
        self,
        db: Database,
        backend: Backend,
        logs: LogStore,
        settings: Settings,
        mint_token: Callable[[str, int, float], str] | None = None,
    ) -> None:
        self.mint_token = mint_token
        self.db = db
        self.backend = backend
        self.logs = logs
        self.settings = settings
        self.owner = settings.resolved_instance_id
        self._wake = threading.Event()
        self._dirty: set[str] = set()  # jobs whose attempts reported a change since the last pass
        self._dirty_lock = threading.Lock()
        self._next_sweep = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen_active: set[str] = set()
        self._first_pass = True
        self.housekeeping: list[Any] = []  # callables run about once a minute
        self._next_housekeeping = 0.0

    # -- thread ---------------------------------------------------------------------------------------

    def wake(self, job_id: str | None = None) -> None:
        """Run a pass now. With a job id, that job's attempt changed (the shim said so) and is observed."""
        if job_id is not None:
            with self._dirty_lock:
                self._dirty.add(job_id)
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kiln-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        woken = False
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_once(full=not woken)
            except Exception:
                log.exception("reconcile pass failed; retrying")
                self._stop.wait(1.0)
            woken = self._wake.wait(self.settings.reconcile_interval)

    # -- one pass -------------------------------------------------------------------------------------

    def run_once(self, full: bool = True) -> None:
        """One pass. A woken pass observes only the attempts that reported a change; every
        ``reconcile_interval`` a full sweep observes all of them (nothing is missed if a notice is lost)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            full = True
        if full:
            self._next_sweep = now + self.settings.reconcile_interval
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        jobs = self._claim() if full else self._leased(dirty)
        if self._first_pass:
            self._first_pass = False
            self._note_reattached([j for j in jobs if JobState(j.state).active])
        for job in jobs:
            if JobState(job.state).active:
                self._observe(job)
        if self._schedule():
            self._wake.set()  # more were placed than one pass starts: go again at once
        if time.monotonic() >= self._next_housekeeping:
            self._next_housekeeping = time.monotonic() + 60
            for task in self.housekeeping:
                try:
                    task()
                except Exception:
                    log.exception("housekeeping task failed")

    def _claim(self) -> list[Job]:
        """Take or renew the lease on every open job of this backend that nobody else holds."""
        now = utcnow()
        expires = now + timedelta(seconds=self.settings.lease_seconds)
        renew_before = now + timedelta(seconds=self.settings.lease_seconds / 2)
        claimable = (
            Job.state.in_([str(s) for s in OPEN_STATES]),
            Job.backend == self.backend.name,
            or_(
                Job.lease_owner.is_(None),
                Job.lease_expires_at < now,
                (Job.lease_owner == self.owner) & (Job.lease_expires_at < renew_before),
            ),
        )
        with self.db.transaction() as s:
            if self.db.dialect == "postgresql":
                ids = list(s.scalars(select(Job.id).where(*claimable).with_for_update(skip_locked=True)))
                if ids:
                    s.execute(
                        update(Job).where(Job.id.in_(ids)).values(lease_owner=self.owner, lease_expires_at=expires)
                    )
            else:
                s.execute(update(Job).where(*claimable).values(lease_owner=self.owner, lease_expires_at=expires))
            return list(
                s.scalars(
                    select(Job)
                    .where(Job.state.in_([str(x) for x in OPEN_STATES]), Job.lease_owner == self.owner)
                    .order_by(Job.created_at, Job.id)
                )
            )

    def _leased(self, job_ids: set[str]) -> list[Job]:
        """The given jobs, where this reconciler holds their lease (a woken pass needs no new claims)."""
        if not job_ids:
            return []
        with self.db.read() as s:
            return list(
                s.scalars(
                    select(Job).where(
                        Job.id.in_(sorted(job_ids)),
                        Job.state.in_([str(x) for x in OPEN_STATES]),
                        Job.lease_owner == self.owner,
                    )
                )
            )

    def _claimable(self, now: datetime) -> ColumnElement[bool]:
        return or_(Job.lease_owner.is_(None), Job.lease_owner == self.owner, Job.lease_expires_at < now)

    def _note_reattached(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        with self.db.transaction() as s:
            for job in jobs:
                row = s.get(Job, job.id)
                if row is not None:
                    record(s, row, Reason.REATTACHED, f"server (re)started; re-attached to attempt {job.attempt}")
        log.info("re-attached to %d running job(s)", len(jobs))

    # -- observing attempts ---------------------------------------------------------------------------

    def _observe(self, job: Job) -> None:
        handle = dict(job.handle or self.backend.handle_for(job.id, job.attempt))
        if job.cancel_requested and not handle.get("cancel_sent"):
            self.backend.cancel(handle, self.settings.kill_grace_seconds)
            handle["cancel_sent"] = True
            self._update(job.id, handle=handle)
        status = self.backend.poll(handle)
        if status.phase is Phase.STARTING:
            return
        if status.phase is Phase.RUNNING:
            if job.state == JobState.STARTING:
                self._mark_running(job.id, status)
            return
        self._finish_attempt(job, handle, status)

    def _update(self, job_id: str, **values: Any) -> None:
        with self.db.transaction() as s:
            s.execute(update(Job).where(Job.id == job_id).values(**values))

    def _mark_running(self, job_id: str, status: AttemptStatus) -> None:
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is None or job.state != JobState.STARTING:
                return
            transition(s, job, JobState.RUNNING, Reason.STARTED, "the command is running")

    def _finish_attempt(self, job: Job, handle: dict[str, Any], status: AttemptStatus) -> None:
        copied, copied_bytes, copy_error = 0, 0, ""
        try:
            copied, copied_bytes = self.backend.collect_outputs(handle, outputs_prefix(job.org_id, job.id))
        except Exception as exc:  # keep the job's outcome even when its outputs cannot be kept
            copy_error = f"; collecting outputs failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: collecting outputs failed: %s", job.id, exc)
        if status.phase is Phase.LOST:
            self.backend.cleanup(handle)
        spec = JobSpec.model_validate(job.spec)
        with self.db.transaction() as s:
            row = s.get(Job, job.id)
            if row is None or JobState(row.state).terminal or row.attempt != job.attempt:
                return  # already handled: an attempt's end is applied exactly once
            row.exit_code = status.exit_code
            row.output_bytes = copied_bytes or row.output_bytes
            if row.state == JobState.STARTING and status.running_at is not None:
                transition(s, row, JobState.RUNNING, Reason.STARTED, "the command started")
            if row.cancel_requested or status.reason == Reason.CANCELLED:
                transition(s, row, JobState.CANCELLED, Reason.CANCELLED, (status.message or "cancelled") + copy_error)
                return
            if status.phase is Phase.EXITED and status.reason == Reason.COMPLETED and status.exit_code == 0:
                message = f"exit code 0; {copied} output file(s) kept" + copy_error
                transition(s, row, JobState.SUCCEEDED, Reason.COMPLETED, message)
                return
            reason = status.reason or Reason.ERROR
            message = status.message or f"exit code {status.exit_code}"
            restartable = (
                row.restarts < spec.max_restarts
                and reason not in PERMANENT_REASONS
                and (not spec.restart_on_exit_codes or status.exit_code in spec.restart_on_exit_codes)
            )
            if restartable:
                row.restarts += 1
                row.not_before = utcnow() + timedelta(seconds=self.settings.restart_backoff_seconds)
                text = f"{reason}: {message}; restart {row.restarts} of {spec.max_restarts}"
                transition(s, row, JobState.RESTARTING, Reason.RESTART, text + copy_error)
            else:
                transition(s, row, JobState.FAILED, reason, message + copy_error)
        if restartable:
            self.logs.append_system(job.id, f"attempt {job.attempt} failed ({reason}); restarting")

    # -- scheduling -----------------------------------------------------------------------------------

    def _schedule(self) -> bool:
        """Place and start what fits; True when placements were left for the next pass."""
        now = utcnow()
        with self.db.read() as s:
            waiting = list(
                s.scalars(
                    select(Job)
                    .where(
                        Job.backend == self.backend.name,
                        self._claimable(now),
                        Job.state.in_([JobState.QUEUED, JobState.RESTARTING]),
                    )
                    .order_by(Job.created_at, Job.id)
                )
            )
            active = list(
                s.execute(
                    select(Job.allocation).where(
                        Job.backend == self.backend.name,
                        Job.state.in_([JobState.STARTING, JobState.RUNNING]),
                    )
                ).scalars()
            )
        queue = [j for j in waiting if j.state == JobState.QUEUED or (j.not_before is None or j.not_before <= now)]
        if not queue:
            return False
        held = [Held(a.get("cpus", 0.0), a.get("memory"), tuple(a.get("gpus", ()))) for a in active if a is not None]
        org_ids = sorted({j.org_id for j in queue})
        with self.db.read() as s:
            limits = load_limits(s, org_ids)
            usage = load_usage(s, [o for o in org_ids if o in limits])
            names = dict(
                s.execute(select(Organization.id, Organization.name).where(Organization.id.in_(org_ids))).all()
            )
        requests = [
            Request(j.id, j.cpus, j.memory, j.gpus, j.org_id, names.get(j.org_id, j.org_id), j.category) for j in queue
        ]
        decision = decide(requests, self.backend.inventory(), held, limits, usage)
        by_id = {j.id: j for j in queue}
        for job_id, why in decision.unschedulable.items():
            self._fail_waiting(job_id, Reason.INSUFFICIENT_RESOURCES, f"can never run here: the job {why}")
        for job_id, why in decision.waiting.items():
            if by_id[job_id].message != why:
                self._note_waiting(job_id, why)
        # Start a bounded batch per pass so that a burst of submissions does not delay observing the jobs
        # already started (their RUNNING) behind hundreds of process starts.
        started_by = time.monotonic() + MAX_START_SECONDS_PER_PASS
        for placement in decision.placements:
            if time.monotonic() > started_by:
                return True
            self._start(
                by_id[placement.job_id],
                placement.cpus,
                placement.memory,
                placement.gpus,
                names.get(by_id[placement.job_id].org_id, ""),
            )
        return False

    def _token(self, job: Job) -> str | None:
        if self.mint_token is None:
            return None
        spec_timeout = (job.spec or {}).get("timeout")
        ttl = self.settings.job_token_ttl_seconds
        if spec_timeout:
            ttl = min(ttl, float(spec_timeout) + 3600)
        return self.mint_token(job.id, job.attempt, ttl)

    def _fail_waiting(self, job_id: str, reason: str, message: str) -> None:
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is not None and job.state in (JobState.QUEUED, JobState.RESTARTING):
                transition(s, job, JobState.FAILED, reason, message)

    def _note_waiting(self, job_id: str, why: str) -> None:
        with self.db.transaction() as s:
            job = s.get(Job, job_id)
            if job is None or job.state not in (JobState.QUEUED, JobState.RESTARTING):
                return
            set_waiting(s, job, why)

    def _start(self, queued: Job, cpus: float, memory: int | None, gpus: tuple[int, ...], org_name: str) -> None:
        now = utcnow()
        with self.db.transaction() as s:
            job = s.get(Job, queued.id, with_for_update=self.db.dialect == "postgresql")
            if job is None or job.state not in (JobState.QUEUED, JobState.RESTARTING):
                return
            if job.lease_owner not in (None, self.owner) and job.lease_expires_at and job.lease_expires_at > now:
                return  # another server holds it
            job.lease_owner = self.owner
            job.lease_expires_at = now + timedelta(seconds=self.settings.lease_seconds)
            if job.cancel_requested:
                transition(s, job, JobState.CANCELLED, Reason.CANCELLED, "cancelled before it started")
                return
            waiting = admit(s, self.db.dialect, job, org_name or job.org_id)
            if waiting:  # another scheduler admitted work for this organisation since the decision was made
                set_waiting(s, job, waiting)
                return
            job.attempt += 1
            job.allocation = {"cpus": cpus, "memory": memory, "gpus": list(gpus)}
            job.handle = self.backend.handle_for(job.id, job.attempt)
            job.not_before = None
            where = f"{cpus:g} CPU(s)" + (f", GPUs {list(gpus)}" if gpus else "")
            transition(s, job, JobState.STARTING, Reason.SCHEDULED, f"attempt {job.attempt} placed on {where}")
            launch = Launch(
                job_id=job.id,
                org_id=job.org_id,
                attempt=job.attempt,
                spec=JobSpec.model_validate(job.spec),
                cpus=cpus,
                memory=memory,
                gpus=gpus,
                code_key=blob_key(job.org_id, job.code_sha256) if job.code_sha256 else None,
                job_token=self._token(job),
                api_endpoint=self.settings.endpoint,
            )
        # Committed STARTING first: after a crash here the attempt is found by its handle, never run twice.
        try:
            self.backend.start(launch)
        except BackendError as exc:
            reason = Reason.RUNTIME_ERROR if "runtime" in exc.message else Reason.BACKEND_ERROR
            with self.db.transaction() as s:
                job = s.get(Job, queued.id)
                if job is not None and job.state == JobState.STARTING:
                    transition(s, job, JobState.FAILED, reason, exc.message)
