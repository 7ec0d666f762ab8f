"""The reconcile loop: leases the jobs it works on, observes attempts through the backend, applies the
placement decision, and moves jobs through ``transition``. It keeps no state the database does not have, so a
restarted server picks up exactly where the last one stopped (re-attaching to running attempts)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import String, Table, Text, bindparam, column, insert, or_, select, update, values
from sqlalchemy.orm import Session

from kiln.backends.base import AttemptStatus, Backend, Launch, Phase, ResolvedInput, Slot
from kiln.db.models import Job, JobEvent, utcnow
from kiln.db.session import Database
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason
from kiln.errors import BackendError, InvalidInput, KilnError
from kiln.scheduler.inputs import allocation_of, gather, redact
from kiln.scheduler.policy import Decision
from kiln.services.blobs import blob_key
from kiln.services.lifecycle import record, transition
from kiln.services.quotas import admit
from kiln.settings import Settings
from kiln.storage.logs import LogStore

log = logging.getLogger(__name__)

JOBS_TABLE = cast(Table, Job.__table__)
EVENTS_TABLE = cast(Table, JobEvent.__table__)

MAX_START_SECONDS_PER_PASS = 0.05
LEFTOVER_SECONDS = 2.0  # placements older than this are decided again rather than started
OPEN_STATES = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING]
# Failures that a retry cannot fix: the spec itself is wrong.
PERMANENT_REASONS = {Reason.COMMAND_NOT_FOUND, Reason.RUNTIME_ERROR, Reason.CODE_ERROR, Reason.INPUT_ERROR}


def set_waiting(s: Session, job: Job, why: str) -> None:
    """Say why a job waits. An event only when the kind of wait changes (queued → capacity → quota): a moving
    queue position or changing free numbers just update the message, so a long queue does not flood events."""
    before = (job.message or "").split(":", 1)[0]
    job.message = why
    if before != why.split(":", 1)[0]:
        record(s, job, "Waiting", why)


def outputs_prefix(org_id: str, job_id: str) -> str:
    return f"orgs/{org_id}/jobs/{job_id}/outputs"


def checkpoints_prefix(org_id: str, job_id: str) -> str:
    return f"orgs/{org_id}/jobs/{job_id}/checkpoints"


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
        self.last_decision: Decision | None = None
        self._leftover: list[tuple[Any, tuple[Slot, ...]]] = []  # placements decided but not started yet
        self._leftover_names: dict[str, str] = {}
        self._leftover_at = 0.0
        # (org id, spec) → the spec's inputs resolved to files; set by the platform when datasets exist.
        self.resolve_inputs: Callable[[str, JobSpec], tuple[ResolvedInput, ...]] | None = None
        self.on_started: Callable[[Job], None] | None = None  # called in the transaction that made a job STARTING

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
        elif job.preempt_reason and not handle.get("preempt_sent"):
            sent_at = time.time()  # before the notice: an exit 0 after it is the job obeying the notice
            self.backend.preempt(handle, job.preempt_reason, self.settings.preemption_grace_seconds)
            handle["preempt_sent"] = True
            handle["preempt_sent_at"] = sent_at
            self._update(job.id, handle=handle)
            self.logs.append_system(job.id, f"preempted: {job.preempt_reason}; the job is warned and stopped")
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
        try:
            self.backend.sync_checkpoints(job.id, checkpoints_prefix(job.org_id, job.id))
        except Exception as exc:
            copy_error += f"; keeping checkpoints in the store failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: keeping checkpoints failed: %s", job.id, exc)
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
            completed = status.phase is Phase.EXITED and status.reason == Reason.COMPLETED and status.exit_code == 0
            warned_at = handle.get("preempt_sent_at")
            if completed and warned_at and status.finished_at and status.finished_at.timestamp() >= warned_at:
                completed = False  # it exited 0 after the notice: it stopped to be preempted, not because it was done
            if row.preempt_reason and not completed:
                # Stopped for a higher-priority job (whatever its exit code after the notice): back to the
                # queue without spending a restart; $KILN_CHECKPOINT_DIR is kept for the next attempt.
                message = f"{row.preempt_reason}; queued again (restarts used: {row.restarts})" + copy_error
                row.preempt_reason = None
                transition(s, row, JobState.QUEUED, Reason.PREEMPTED, message)
                return
            if completed:
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
        """Decide (scheduler.policy) and carry the decision out: fail what can never run, preempt, record why
        the others wait, and start what was placed. True when placements were left for the next pass."""
        if self._leftover and time.monotonic() - self._leftover_at < LEFTOVER_SECONDS:
            # The last decision placed more than one pass starts: start the rest before deciding again (a
            # decision over a long queue costs more than the starts; each start re-checks state and quota).
            return self._start_batch()
        now = utcnow()
        with self.db.read() as s:
            snap = gather(s, self.backend, now)
        # A job leased by another server is that server's to place; it still counts in nobody's queue here.
        mine = [
            p
            for p, j in zip(snap.pending, snap.queue, strict=True)
            if j.lease_owner in (None, self.owner) or j.lease_expires_at is None or j.lease_expires_at < now
        ]
        if not mine:
            return False
        snap.pending = mine
        decision = snap.decide(time.time(), self.settings.preemption)
        self.last_decision = decision
        for job_id, why in decision.unschedulable.items():
            self._fail_waiting(job_id, Reason.INSUFFICIENT_RESOURCES, f"can never run here: the job {why}")
        # Messages may name the jobs that hold a job back; each organisation sees only its own jobs' ids.
        org_of = {p.job_id: p.org_id for p in snap.pending} | {r.job_id: r.org_id for r in snap.running}
        if decision.preemptions:
            self._request_preemptions(
                {victim: redact(why, org_of.get(victim), org_of) for victim, why in decision.preemptions.items()}
            )
        changed = {}
        for job_id, wait in decision.waiting.items():
            message = redact(wait.message, org_of[job_id], org_of)
            if snap.by_id[job_id].message != message:
                changed[job_id] = message
        if changed:
            self._note_waiting(changed, snap.by_id)
        self._leftover = [
            (snap.by_id[p.job_id], tuple(Slot(w.node, w.cpus, w.memory, w.gpus) for w in p.workers))
            for p in decision.placements
        ]
        self._leftover_names = snap.names
        self._leftover_at = time.monotonic()
        return self._start_batch()

    def _start_batch(self) -> bool:
        """Start placements for at most MAX_START_SECONDS_PER_PASS, so that a burst of submissions does not
        delay observing the jobs already started (their RUNNING) behind hundreds of process starts. True when
        some are left for the next pass."""
        started_by = time.monotonic() + MAX_START_SECONDS_PER_PASS
        while self._leftover:
            if time.monotonic() > started_by:
                return True
            job, slots = self._leftover.pop(0)
            self._start(job, slots, self._leftover_names.get(job.org_id, ""))
        return False

    def _request_preemptions(self, victims: dict[str, str]) -> None:
        """Record each victim's preemption; the next observation of the victim warns and stops it (so a
        crash between here and the signal still delivers it, like a cancel)."""
        with self.db.transaction() as s:
            for job_id, why in victims.items():
                job = s.get(Job, job_id)
                if job is None or not JobState(job.state).active or job.preempt_reason:
                    continue
                job.preempt_reason = why
                job.updated_at = utcnow()
                record(s, job, Reason.PREEMPTING, why)
        with self._dirty_lock:
            self._dirty.update(victims)
        self._wake.set()

    def _inputs(self, org_id: str, spec: JobSpec) -> tuple[ResolvedInput, ...]:
        """The job's datasets at the versions pinned at submit, as files the backend stages."""
        if self.resolve_inputs is None:
            raise InvalidInput("inputs: this server keeps no datasets")
        return self.resolve_inputs(org_id, spec)

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

    def _note_waiting(self, changed: dict[str, str], rows: dict[str, Any]) -> None:
        """Say why jobs wait, all in one transaction: the first pass over a long queue writes thousands."""
        now = utcnow()
        events = []
        for job_id, why in changed.items():
            before = (rows[job_id].message or "").split(":", 1)[0]
            if before != why.split(":", 1)[0]:  # an event only when the kind of wait changes
                events.append({"job_id": job_id, "time": now, "reason": Reason.WAITING, "message": why})
        jobs = JOBS_TABLE.c
        waiting = or_(jobs.state == str(JobState.QUEUED), jobs.state == str(JobState.RESTARTING))
        items = list(changed.items())
        with self.db.transaction() as s:
            conn = s.connection()
            if self.db.dialect == "postgresql":
                # One UPDATE ... FROM (VALUES ...) per thousand rows: a round trip per row costs seconds here.
                for start in range(0, len(items), 1000):
                    batch = values(column("b_id", String), column("b_message", Text), name="b").data(
                        items[start : start + 1000]
                    )
                    conn.execute(
                        update(JOBS_TABLE).where(jobs.id == batch.c.b_id, waiting).values(message=batch.c.b_message)
                    )
            else:  # SQLite: executemany of one prepared statement is cheap (no round trips)
                conn.execute(
                    update(JOBS_TABLE)
                    .where(jobs.id == bindparam("b_id"), waiting)
                    .values(message=bindparam("b_message")),
                    [{"b_id": job_id, "b_message": why} for job_id, why in items],
                )
            if events:
                conn.execute(insert(EVENTS_TABLE), events)

    def _start(self, queued: Any, slots: tuple[Slot, ...], org_name: str) -> None:
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
            allocation = allocation_of(slots)
            job.allocation = allocation
            job.handle = self.backend.handle_for(job.id, job.attempt)
            job.not_before = None
            job.preempt_reason = None
            where = f"{allocation['cpus']:g} CPU(s)" + (f", GPUs {allocation['gpus']}" if allocation["gpus"] else "")
            if len(slots) > 1:
                where = f"{len(slots)} gang members, " + where
            transition(s, job, JobState.STARTING, Reason.SCHEDULED, f"attempt {job.attempt} placed on {where}")
            if self.on_started is not None:
                self.on_started(job)
            spec = JobSpec.model_validate(job.spec)
            launch = Launch(
                job_id=job.id,
                org_id=job.org_id,
                attempt=job.attempt,
                spec=spec,
                cpus=slots[0].cpus,
                memory=slots[0].memory,
                gpus=slots[0].gpus,
                code_key=blob_key(job.org_id, job.code_sha256) if job.code_sha256 else None,
                job_token=self._token(job),
                api_endpoint=self.settings.endpoint,
                slots=slots if spec.distributed is not None else (),
            )
        # Committed STARTING first: after a crash here the attempt is found by its handle, never run twice.
        try:
            if spec.inputs:
                launch = replace(launch, inputs=self._inputs(launch.org_id, spec))
            self.backend.start(launch)
        except KilnError as exc:
            reason = (
                Reason.INPUT_ERROR
                if not isinstance(exc, BackendError)
                else Reason.RUNTIME_ERROR
                if "runtime" in exc.message
                else Reason.BACKEND_ERROR
            )
            with self.db.transaction() as s:
                job = s.get(Job, queued.id)
                if job is not None and job.state == JobState.STARTING:
                    transition(s, job, JobState.FAILED, reason, exc.message)
