"""The reconcile loop: leases the jobs it works on, observes attempts through the backend, applies the
placement decision, and moves jobs through ``transition``. It keeps no state the database does not have, so a
restarted server picks up exactly where the last one stopped (re-attaching to running attempts).

One pass, whatever the number of jobs it touches:

1. read the active jobs to observe (a full sweep: every one this server holds or may take; a woken pass: those
   whose attempts reported a change) and ask the backend where each attempt is, collecting the outputs of the
   ones that ended: backend calls only, no transaction open;
2. decide the placements on a snapshot read without the write lock (what the attempts seen ending held counts
   as free), or take the next placements of the last decision;
3. write everything in **one transaction**: the leases (a full sweep), every observed transition, every wait's
   reason, failures, preemption requests, and the STARTING transition of the placements this pass starts, with
   the admission (quotas) re-checked;
4. after that commit, start those attempts (``backend.start``); STARTING is committed first, so after a crash
   the attempt is found by its handle and never started twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import String, Table, Text, bindparam, column, func, insert, or_, select, update, values
from sqlalchemy.orm import Session

from kiln.backends.base import Backend, Launch, Phase, ResolvedInput, Slot
from kiln.backends.capabilities import CheckpointSyncer, JobFiles, OutputCollector, Preemptible
from kiln.db.models import Job, JobEvent, utcnow
from kiln.db.session import Database
from kiln.domain.placement.types import Decision
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason
from kiln.errors import InvalidInput
from kiln.scheduler.outcome import STARTED_BEFORE_END, JobView, Observed, Outcome, decide
from kiln.scheduler.passes import Plan, Seen
from kiln.scheduler.starter import Starter
from kiln.services.lifecycle import record, transition
from kiln.services.quotas import Admission
from kiln.services.scheduler_inputs import allocation_of, gather, redact
from kiln.services.tasks import Task, TaskContext, TaskRunner
from kiln.settings import Settings
from kiln.storage.keys import blob_key, checkpoints_prefix, outputs_prefix
from kiln.storage.logs import LogStore

log = logging.getLogger(__name__)

JOBS_TABLE = cast(Table, Job.__table__)
EVENTS_TABLE = cast(Table, JobEvent.__table__)

# A pass starts about this much work (backend.start calls, timed as they go) so that a burst of submissions does
# not hold up observing the attempts already started behind hundreds of process starts; the rest of the decision
# is started by the next passes, which follow at once. At least MIN_STARTS_PER_PASS: on a loaded machine a start
# takes longer, and a pass's own cost (its reads and its commit) would then be paid for one or two starts. A crash
# between a pass's commit and its starts leaves that share STARTING with no process: the restarted server finds
# those attempts lost (the restart policy applies), as it found the one job being started before passes batched.
MAX_START_SECONDS_PER_PASS = 0.1
MIN_STARTS_PER_PASS = 8
MAX_STARTS_PER_PASS = 64
LEFTOVER_SECONDS = 2.0  # placements older than this are decided again rather than started
OPEN_STATES = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING]
ACTIVE_STATES = [JobState.STARTING, JobState.RUNNING]
WAITING_STATES = (JobState.QUEUED, JobState.RESTARTING)


def set_waiting(s: Session, job: Job, why: str) -> None:
    """Say why a job waits. An event only when the kind of wait changes (queued → capacity → quota): a moving
    queue position or changing free numbers just update the message, so a long queue does not flood events."""
    before = (job.message or "").split(":", 1)[0]
    job.message = why
    if before != why.split(":", 1)[0]:
        record(s, job, "Waiting", why)


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
        self._runner: TaskRunner | None = None  # start()'s own, when no platform runs the task
        self._first_pass = True
        self.last_decision: Decision | None = None
        self._leftover: list[tuple[Any, tuple[Slot, ...]]] = []  # placements decided but not started yet
        self._leftover_names: dict[str, str] = {}
        self._leftover_at = 0.0
        self.starter = Starter(db, backend, self._inputs)
        # (org id, spec) → the spec's inputs resolved to files; set by the platform when datasets exist.
        self.resolve_inputs: Callable[[str, JobSpec], tuple[ResolvedInput, ...]] | None = None
        # Called in the transaction that made a job STARTING, once per job (whatever it reads, it reads per job).
        self.on_started: Callable[[Job], None] | None = None
        # The admission latency of each job a pass starts, in seconds from its entering the queue (submitted,
        # preempted or restarting) to STARTING: read for all of the pass's jobs in one query.
        self.on_admitted: Callable[[float], None] | None = None

    # -- the background task --------------------------------------------------------------------------

    def wake(self, job_id: str | None = None) -> None:
        """Run a pass now. With a job id, that job's attempt changed (the shim said so) and is observed."""
        if job_id is not None:
            with self._dirty_lock:
                self._dirty.add(job_id)
        self._wake.set()

    def task(self) -> Task:
        """The reconcile loop as a background task (kiln.services.tasks): a pass every ``reconcile_interval``, or
        at once when woken. No lease scope: every server runs it, and it leases the jobs themselves row by row."""
        return Task("reconciler", self._pass, self.settings.reconcile_interval, wake=self._wake)

    def _pass(self, ctx: TaskContext) -> None:
        # A pass that left placements or preemptions sets the wake-up itself: the next pass follows at once.
        self.run_once(full=not ctx.woken)

    def start(self) -> None:
        """Run the task on a runner of its own (a server runs it on the platform's runner instead)."""
        self._runner = TaskRunner()
        self._runner.add(self.task())
        self._runner.start()

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.stop()

    # -- one pass -------------------------------------------------------------------------------------

    def run_once(self, full: bool = True) -> None:
        """One pass. A woken pass observes only the attempts that reported a change; every
        ``reconcile_interval`` a full sweep observes all of them (nothing is missed if a notice is lost) and renews
        the leases."""
        now = time.monotonic()
        if now >= self._next_sweep:
            full = True
        if full:
            self._next_sweep = now + self.settings.reconcile_interval
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        first, self._first_pass = self._first_pass, False
        full = full or first
        seen = [self._look(job) for job in self._to_observe(full, dirty)]
        plan = self._plan({x.job.id for x in seen if x.ended})
        self.starter.start(self._write(seen, plan, full=full, first=first))
        if self._leftover:
            self._wake.set()  # more were placed than one pass starts: go again at once

    def _schedule(self) -> bool:
        """A scheduling pass alone (no observing): decide, write, start this pass's share of the placements. True
        when placements were left for the next pass."""
        self.starter.start(self._write([], self._plan(set()), full=False, first=False))
        return bool(self._leftover)

    # -- leases ---------------------------------------------------------------------------------------

    def _take_leases(self, s: Session) -> None:
        """Inside ``s``: take or renew the lease on every open job of this backend that nobody else holds."""
        now = utcnow()
        expires = now + timedelta(seconds=self.settings.lease_seconds)
        renew_before = now + timedelta(seconds=self.settings.lease_seconds / 2)
        claimable = (
            Job.state.in_([str(x) for x in OPEN_STATES]),
            Job.backend == self.backend.name,
            or_(
                Job.lease_owner.is_(None),
                Job.lease_expires_at < now,
                (Job.lease_owner == self.owner) & (Job.lease_expires_at < renew_before),
            ),
        )
        if self.db.dialect == "postgresql":
            ids = list(s.scalars(select(Job.id).where(*claimable).with_for_update(skip_locked=True)))
            if ids:
                s.execute(update(Job).where(Job.id.in_(ids)).values(lease_owner=self.owner, lease_expires_at=expires))
        else:
            s.execute(update(Job).where(*claimable).values(lease_owner=self.owner, lease_expires_at=expires))

    def _claim(self) -> list[Job]:
        """Take or renew the leases (a transaction of its own) and return every open job this reconciler holds."""
        with self.db.transaction() as s:
            self._take_leases(s)
            return list(
                s.scalars(
                    select(Job)
                    .where(Job.state.in_([str(x) for x in OPEN_STATES]), Job.lease_owner == self.owner)
                    .order_by(Job.created_at, Job.id)
                )
            )

    def _to_observe(self, full: bool, dirty: set[str]) -> list[Job]:
        """The active jobs this pass observes, read without a transaction that writes. A full sweep: every one
        this reconciler holds or may take (the pass's transaction takes the leases; a job another server took in
        between is left alone there). A woken pass: the given jobs, where this reconciler holds their lease."""
        active = [str(x) for x in ACTIVE_STATES]
        if full:
            query = select(Job).where(
                Job.backend == self.backend.name,
                Job.state.in_(active),
                or_(Job.lease_owner == self.owner, Job.lease_owner.is_(None), Job.lease_expires_at < utcnow()),
            )
        elif dirty:
            query = select(Job).where(Job.id.in_(sorted(dirty)), Job.state.in_(active), Job.lease_owner == self.owner)
        else:
            return []
        with self.db.read() as s:
            return list(s.scalars(query.order_by(Job.created_at, Job.id)))

    def _rows(self, s: Session, ids: Iterable[str], *, lock: bool = True, skip_locked: bool = False) -> dict[str, Job]:
        """The rows of these jobs in one query (on PostgreSQL locked, in id order)."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        query = select(Job).where(Job.id.in_(wanted))
        if lock and self.db.dialect == "postgresql":
            query = query.order_by(Job.id).with_for_update(skip_locked=skip_locked)
        return {row.id: row for row in s.scalars(query)}

    # -- observing attempts ---------------------------------------------------------------------------

    def _look(self, job: Job) -> Seen:
        """Ask the backend where the job's attempt is (sending a requested cancel or preemption first), and
        collect what an attempt that ended left behind. No database access: the pass's transaction writes it."""
        seen = Seen(job, dict(job.handle or self.backend.handle_for(job.id, job.attempt)))
        handle = seen.handle
        if job.cancel_requested and not handle.get("cancel_sent"):
            self.backend.cancel(handle, self.settings.kill_grace_seconds)
            handle["cancel_sent"] = True
            seen.handle_changed = True
        elif job.preempt_reason and not handle.get("preempt_sent"):
            sent_at = time.time()  # before the notice: an exit 0 after it is the job obeying the notice
            if isinstance(self.backend, Preemptible):
                self.backend.preempt(handle, job.preempt_reason, self.settings.preemption_grace_seconds)
            else:  # no notice channel, no reason of its own: a cancel with the preemption's grace
                self.backend.cancel(handle, self.settings.preemption_grace_seconds)
            handle["preempt_sent"] = True
            handle["preempt_sent_at"] = sent_at
            seen.handle_changed = True
            seen.notes.append(f"preempted: {job.preempt_reason}; the job is warned and stopped")
        status = self.backend.poll(handle)
        if status.phase is Phase.STARTING:
            return seen
        if status.phase is Phase.RUNNING:
            if job.state == JobState.STARTING:
                seen.status = status
            return seen
        seen.status = status
        seen.log_bytes = self.logs.size(job.id)  # counted in the organisation's storage (services/quotas.py)
        backend = self.backend
        try:
            if isinstance(backend, OutputCollector):
                seen.copied, seen.copied_bytes = backend.collect_outputs(handle, outputs_prefix(job.org_id, job.id))
        except Exception as exc:  # keep the job's outcome even when its outputs cannot be kept
            seen.copy_error = f"; collecting outputs failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: collecting outputs failed: %s", job.id, exc)
        try:
            if isinstance(backend, CheckpointSyncer):
                backend.sync_checkpoints(job.id, checkpoints_prefix(job.org_id, job.id))
        except Exception as exc:
            seen.copy_error += f"; keeping checkpoints in the store failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: keeping checkpoints failed: %s", job.id, exc)
        if status.phase is Phase.LOST:
            self.backend.cleanup(handle)
        return seen

    def _apply(self, s: Session, row: Job | None, seen: Seen) -> None:
        """Write what was seen of one attempt, if the row is still that attempt's and this server's: the outcome
        ``scheduler.outcome.decide`` gives, carried out through ``transition``."""
        if row is None or row.attempt != seen.job.attempt or row.lease_owner != self.owner:
            return  # already handled elsewhere, or another server took the job: an attempt's end is applied once
        if not JobState(row.state).active:
            return
        if seen.handle_changed:
            row.handle = seen.handle
        if seen.status is None:
            return
        observed = Observed(seen.status, seen.handle.get("preempt_sent_at"), seen.copied, seen.copy_error)
        spec = JobSpec.model_validate(row.spec)
        backoff = self.settings.restart_backoff_seconds
        outcome = decide(JobView.of(row), spec, observed, now=utcnow(), restart_backoff_seconds=backoff)
        if outcome is not None:
            self._end_attempt(s, row, seen, outcome)

    @staticmethod
    def _end_attempt(s: Session, row: Job, seen: Seen, outcome: Outcome) -> None:
        """Carry out one attempt's outcome in the pass's transaction; what it leaves for after the commit (the
        job's log line, freeing its files) goes on ``seen``."""
        if outcome.ended:
            row.exit_code = outcome.exit_code
            row.output_bytes = seen.copied_bytes or row.output_bytes
            row.log_bytes = max(row.log_bytes or 0, seen.log_bytes)
        if outcome.started:
            transition(s, row, JobState.RUNNING, Reason.STARTED, STARTED_BEFORE_END)
        if outcome.clear_preemption:
            row.preempt_reason = None
        if outcome.restart:
            row.restarts += 1
            row.not_before = outcome.not_before
        transition(s, row, outcome.state, outcome.reason, outcome.message)
        if outcome.note:
            seen.notes.append(outcome.note)
        seen.keep_files = outcome.release

    # -- scheduling -----------------------------------------------------------------------------------

    def _plan(self, released: Collection[str]) -> Plan:
        """Decide (domain.placement) on a snapshot read without the write lock, or take the next placements of
        the last decision while it is fresh (a decision over a long queue costs more than the starts; each start
        re-checks state and quota). ``released``: jobs whose attempts this pass saw end (their allocations count as
        free)."""
        if self._leftover and time.monotonic() - self._leftover_at < LEFTOVER_SECONDS:
            return Plan(starts=self._next_starts(), names=self._leftover_names)
        self._leftover = []
        now = utcnow()
        with self.db.read() as s:
            snap = gather(s, self.backend, now, released=released)
        # A job leased by another server is that server's to place; it still counts in nobody's queue here.
        mine = [
            p
            for p, j in zip(snap.pending, snap.queue, strict=True)
            if j.lease_owner in (None, self.owner) or j.lease_expires_at is None or j.lease_expires_at < now
        ]
        if not mine:
            return Plan()
        snap.pending = mine
        decision = snap.decide(time.time(), self.settings.preemption)
        self.last_decision = decision
        plan = Plan(rows=snap.by_id, names=snap.names)
        plan.unschedulable = {
            job_id: f"can never run here: the job {why}" for job_id, why in decision.unschedulable.items()
        }
        # Messages may name the jobs that hold a job back; each organisation sees only its own jobs' ids.
        org_of = {p.job_id: p.org_id for p in snap.pending} | {r.job_id: r.org_id for r in snap.running}
        plan.preemptions = {
            victim: redact(why, org_of.get(victim), org_of) for victim, why in decision.preemptions.items()
        }
        for job_id, wait in decision.waiting.items():
            message = redact(wait.message, org_of[job_id], org_of)
            if snap.by_id[job_id].message != message:
                plan.waiting[job_id] = message
        self._leftover = [
            (snap.by_id[p.job_id], tuple(Slot(w.node, w.cpus, w.memory, w.gpus) for w in p.workers))
            for p in decision.placements
        ]
        self._leftover_names = snap.names
        self._leftover_at = time.monotonic()
        plan.starts = self._next_starts()
        return plan

    def _next_starts(self) -> list[tuple[Any, tuple[Slot, ...]]]:
        """This pass's share of the placements: about MAX_START_SECONDS_PER_PASS of starts."""
        n = int(MAX_START_SECONDS_PER_PASS / max(self.starter.seconds, 1e-4))
        n = max(MIN_STARTS_PER_PASS, min(MAX_STARTS_PER_PASS, n))
        starts, self._leftover = self._leftover[:n], self._leftover[n:]
        return starts

    # -- the pass's transaction -----------------------------------------------------------------------

    def _write(self, seen: list[Seen], plan: Plan, *, full: bool, first: bool) -> list[Launch]:
        """Everything the pass decided, in one transaction; returns the attempts to start once it committed."""
        writes = [x for x in seen if x.writes]
        if not (full or writes or plan.writes):
            return []
        reattached = 0
        with self.db.transaction() as s:
            if full:
                self._take_leases(s)
            rows = self._rows(s, [x.job.id for x in (seen if first else writes)])
            if first:
                reattached = self._note_reattached(s, rows.values())
            for x in writes:
                self._apply(s, rows.get(x.job.id), x)
            if plan.unschedulable:
                self._fail_waiting(s, plan.unschedulable)
            if plan.preemptions:
                self._request_preemptions(s, plan.preemptions)
            if plan.waiting:
                self._note_waiting(s, plan.waiting, plan.rows)
            launches = self._mark_starting(s, plan.starts, plan.names)
        if reattached:
            log.info("re-attached to %d running job(s)", reattached)
        for x in seen:
            for note in x.notes:
                self.logs.append_system(x.job.id, note)
            # Its outputs and checkpoints are in the store, its end committed: its local files may go.
            if x.keep_files is not None and isinstance(self.backend, JobFiles):
                try:
                    self.backend.release(x.job.id, x.keep_files)
                except Exception:
                    log.exception("job %s: freeing its local files failed", x.job.id)
        if plan.preemptions:  # the next observation of each victim warns and stops it
            with self._dirty_lock:
                self._dirty.update(plan.preemptions)
            self._wake.set()
        return launches

    def _note_reattached(self, s: Session, rows: Iterable[Job]) -> int:
        count = 0
        for row in rows:
            if JobState(row.state).active and row.lease_owner == self.owner:
                record(s, row, Reason.REATTACHED, f"server (re)started; re-attached to attempt {row.attempt}")
                count += 1
        return count

    def _fail_waiting(self, s: Session, failures: dict[str, str]) -> None:
        for job_id, row in self._rows(s, failures).items():
            if row.state in WAITING_STATES:
                transition(s, row, JobState.FAILED, Reason.INSUFFICIENT_RESOURCES, failures[job_id])

    def _request_preemptions(self, s: Session, victims: dict[str, str]) -> None:
        """Record each victim's preemption; the next observation of the victim warns and stops it (so a
        crash between here and the signal still delivers it, like a cancel)."""
        for job_id, row in self._rows(s, victims).items():
            if not JobState(row.state).active or row.preempt_reason:
                continue
            row.preempt_reason = victims[job_id]
            row.updated_at = utcnow()
            record(s, row, Reason.PREEMPTING, victims[job_id])

    def _note_waiting(self, s: Session, changed: dict[str, str], rows: dict[str, Any]) -> None:
        """Say why jobs wait, in bulk: the first pass over a long queue writes thousands."""
        now = utcnow()
        events = []
        for job_id, why in changed.items():
            before = (rows[job_id].message or "").split(":", 1)[0]
            if before != why.split(":", 1)[0]:  # an event only when the kind of wait changes
                events.append({"job_id": job_id, "time": now, "reason": Reason.WAITING, "message": why})
        jobs = JOBS_TABLE.c
        waiting = or_(jobs.state == str(JobState.QUEUED), jobs.state == str(JobState.RESTARTING))
        items = list(changed.items())
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
                update(JOBS_TABLE).where(jobs.id == bindparam("b_id"), waiting).values(message=bindparam("b_message")),
                [{"b_id": job_id, "b_message": why} for job_id, why in items],
            )
        if events:
            conn.execute(insert(EVENTS_TABLE), events)

    def _mark_starting(
        self, s: Session, starts: list[tuple[Any, tuple[Slot, ...]]], names: dict[str, str]
    ) -> list[Launch]:
        """Move this pass's placements to STARTING (each re-checked: still waiting, not another server's, not
        cancelled, admitted by its organisation's quota) and say what to start once that is committed."""
        if not starts:
            return []
        # On PostgreSQL a row another transaction holds is skipped (that server is placing or claiming it; the
        # next decision sees what became of it): waiting for it could deadlock two servers' passes.
        rows = self._rows(s, [queued.id for queued, _ in starts], skip_locked=True)
        now = utcnow()
        placed: list[tuple[Job, tuple[Slot, ...]]] = []
        for queued, slots in starts:
            job = rows.get(queued.id)
            if job is None or job.state not in WAITING_STATES:
                continue
            if job.lease_owner not in (None, self.owner) and job.lease_expires_at and job.lease_expires_at > now:
                continue  # another server holds it
            job.lease_owner = self.owner
            job.lease_expires_at = now + timedelta(seconds=self.settings.lease_seconds)
            if job.cancel_requested:
                transition(s, job, JobState.CANCELLED, Reason.CANCELLED, "cancelled before it started")
                continue
            placed.append((job, slots))
        if not placed:
            return []
        admission = Admission(s, self.db.dialect, [job.org_id for job, _ in placed])
        queued_at = self._queued_at(s, [job.id for job, _ in placed]) if self.on_admitted is not None else {}
        launches = []
        for job, slots in placed:
            waiting = admission.admit(job, names.get(job.org_id) or job.org_id)
            if waiting:  # another scheduler admitted work for this organisation since the decision was made
                set_waiting(s, job, waiting)
                continue
            launches.append(self._starting(s, job, slots, now))
            if self.on_admitted is not None:
                since = queued_at.get(job.id) or job.created_at
                try:
                    self.on_admitted(max(0.0, (now - since).total_seconds()))
                except Exception:  # a metric must never stop a job from starting
                    log.exception("observing the admission latency failed")
        return launches

    @staticmethod
    def _queued_at(s: Session, job_ids: list[str]) -> dict[str, datetime]:
        """When each job last entered the queue (its latest event to QUEUED or RESTARTING)."""
        waiting = [str(x) for x in WAITING_STATES]
        query = (
            select(JobEvent.job_id, func.max(JobEvent.time))
            .where(JobEvent.job_id.in_(job_ids), JobEvent.to_state.in_(waiting))
            .group_by(JobEvent.job_id)
        )
        return {job_id: at for job_id, at in s.execute(query)}

    def _starting(self, s: Session, job: Job, slots: tuple[Slot, ...], now: datetime) -> Launch:
        job.attempt += 1
        allocation = allocation_of(slots)
        job.allocation = allocation
        job.handle = self.backend.handle_for(job.id, job.attempt)
        job.not_before = None
        job.preempt_reason = None
        where = f"{allocation['cpus']:g} CPU(s)" + (f", GPUs {allocation['gpus']}" if allocation["gpus"] else "")
        if len(slots) > 1:
            where = f"{len(slots)} gang members, " + where
        transition(s, job, JobState.STARTING, Reason.SCHEDULED, f"attempt {job.attempt} placed on {where}", now=now)
        if self.on_started is not None:
            self.on_started(job)
        spec = JobSpec.model_validate(job.spec)
        return Launch(
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

    # -- what a start needs ---------------------------------------------------------------------------

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
