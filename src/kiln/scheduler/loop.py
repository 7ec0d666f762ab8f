"""The reconcile loop: leases the jobs it works on, observes attempts through the backend, applies the
placement decision, and moves jobs through ``transition``. It keeps no state the database does not have, so a
restarted server picks up exactly where the last one stopped (re-attaching to running attempts).

One pass, whatever the number of jobs it touches:

1. read the active jobs to observe (a full sweep: every one this server holds or may take; a woken pass: those
   whose attempts reported a change) and ask the backend where each attempt is, collecting the outputs of the
   ones that ended: backend calls only, no transaction open (``kiln.scheduler.observe``);
2. decide the placements on a snapshot read without the write lock (what the attempts seen ending held counts
   as free), or take the next placements of the last decision;
3. write everything in **one transaction**: the leases (a full sweep), every observed transition, every wait's
   reason, failures, preemption requests, and the STARTING transition of the placements this pass starts, with
   the admission (quotas) re-checked;
4. after that commit, start those attempts (``backend.start``).

Crash safety. STARTING is committed before the start, with the launch the row expects in its handle (the
attempt, a launch token the backend's supervisor records too). A server that dies between the commit and the
start (or a start that raised) leaves an attempt no supervisor runs: the next observation finds it
``Phase.UNLAUNCHED`` and the pass launches it again, the same attempt (never a failure of the job, never a
re-attachment that did not happen); one that finds the supervisor alive or its exit record adopts it with its
real outcome. The backend's start is idempotent per attempt, so whichever launch comes up first runs the job's
command and any other runs nothing (the local executor: ``kiln.injob.claim``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, or_, select
from sqlalchemy.orm import Session

from kiln.backends.base import Backend, Launch, Phase, ResolvedInput, Slot
from kiln.backends.capabilities import JobFiles
from kiln.db.session import Database
from kiln.db.tables import Job, utcnow
from kiln.domain.ids import new_id
from kiln.domain.placement.types import Node
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState, Reason
from kiln.domain.stored_spec import StoredSpec
from kiln.errors import InvalidInput
from kiln.scheduler.capacity import still_free
from kiln.scheduler.leases import OPEN_STATES, job_leases_due, note_takeovers, take_job_leases
from kiln.scheduler.observe import Observer, log_source
from kiln.scheduler.outcome import STARTED_BEFORE_END, JobView, Observed, Outcome, decide
from kiln.scheduler.outputs_gate import OutputsGate
from kiln.scheduler.passes import Plan, Seen
from kiln.scheduler.starter import Starter
from kiln.scheduler.waiting import WAITING_STATES, note_waiting, queued_at, set_waiting
from kiln.settings import Settings
from kiln.storage.keys import blob_key
from kiln.storage.logs import LogStore
from kiln.tasks.runner import Task, TaskContext
from kiln.usecases.access.quotas import Admission
from kiln.usecases.jobs.lifecycle import ends_in_bulk, record, transition
from kiln.usecases.jobs.scheduler_inputs import allocation_of, gather, redact
from kiln.usecases.usage.usage import unbill_usage

log = logging.getLogger(__name__)

# A pass starts about this much work (backend.start calls, timed as they go) so that a burst of submissions does
# not hold up observing the attempts already started behind hundreds of process starts; the rest of the decision
# is started by the next passes, which follow at once. At least MIN_STARTS_PER_PASS: on a loaded machine a start
# takes longer, and a pass's own cost (its reads and its commit) would then be paid for one or two starts. A crash
# between a pass's commit and its starts leaves that share STARTING with no process: the restarted server's first
# pass launches them (``Relaunched``).
MAX_START_SECONDS_PER_PASS = 0.1
MIN_STARTS_PER_PASS = 8
MAX_STARTS_PER_PASS = 64
LEFTOVER_SECONDS = 2.0  # placements older than this are decided again rather than started
ACTIVE_STATES = [JobState.STARTING, JobState.RUNNING]
# Launches of one attempt before the job fails with BackendError: each is a start that raised, or a server that
# stopped before starting it; more than this is a start that cannot succeed, not bad luck.
MAX_LAUNCHES = 5
# An attempt a submit placed is left to the pass that starts it for at most this long (a submit that rolled back
# after placing it leaves nothing to start; one that committed hands it over at once).
LAUNCHING_SECONDS = 30.0
# A pass due when another server's lease on a waiting job runs out comes this much after it (the lease must be seen
# expired: ``lease_expires_at < now``).
TAKEOVER_SLACK_SECONDS = 0.01


# What observing an attempt reads of its job (kiln.scheduler.observe.Observer.look, and the pass's bookkeeping):
# these columns, not whole rows (a full sweep reads every active job).
_OBSERVED = (
    Job.id,
    Job.org_id,
    Job.state,
    Job.attempt,
    Job.handle,
    Job.cancel_requested,
    Job.preempt_reason,
    Job.message,
    Job.output_bytes,
)


@functools.cache
def _observed_statement(full: bool) -> Any:
    """The jobs a pass observes, built once: a full sweep's (every active job of the backend this server holds
    or may take) or a woken pass's (the bound ``ids`` it holds)."""
    active = [str(x) for x in ACTIVE_STATES]
    query = select(*_OBSERVED).where(Job.state.in_(active))
    if full:
        owner: Any = bindparam("owner")
        query = query.where(
            Job.backend == bindparam("backend"),
            or_(Job.lease_owner == owner, Job.lease_owner.is_(None), Job.lease_expires_at < bindparam("now")),
        )
    else:
        query = query.where(Job.id.in_(bindparam("ids", expanding=True)), Job.lease_owner == bindparam("owner"))
    return query.order_by(Job.created_at, Job.id)


class Reconciler:
    def __init__(
        self,
        db: Database,
        backend: Backend,
        logs: LogStore,
        settings: Settings,
        mint_token: Callable[[str, int, float], str] | None = None,
        *,
        resolve_inputs: Callable[[str, JobSpec], tuple[ResolvedInput, ...]] | None = None,
        on_admitted: Callable[[float], None] | None = None,
        on_ended: Callable[[], None] | None = None,
    ) -> None:
        self.mint_token = mint_token
        self.db = db
        self.backend = backend
        self.logs = logs
        self.settings = settings
        self.owner = settings.resolved_instance_id
        self._wake = threading.Event()
        self._dirty: set[str] = set()  # jobs whose attempts reported a change since the last pass
        self._rescheduled = False  # woken for the queue (a submit, a cancel, a quota), not only for attempts
        self._dirty_lock = threading.Lock()
        self._next_sweep = 0.0
        self._first_pass = True
        self._leftover: list[tuple[Any, tuple[Slot, ...]]] = []  # placements decided but not started yet
        self._leftover_names: dict[str, str] = {}
        self._leftover_at = 0.0
        self._leftover_nodes: list[Node] = []  # the nodes the leftover placements were decided on
        self._handed: list[tuple[Launch, float]] = []  # attempts placed at submit, with when that committed
        # Attempts a submit placed (STARTING, under this server's lease) that this process is about to start: from
        # before the submit commits until the pass that starts them has. A pass that observes one meanwhile finds it
        # never launched, which is no reason to launch it itself: it leaves it to that pass (monotonic time it was
        # placed, so that one whose submit never committed is forgotten).
        self._launching: dict[tuple[str, int], float] = {}
        self._borrowers: dict[str, str] = {}  # placed job id → the waiting job it borrows from (kept in its allocation)
        self._next_takeover: datetime | None = None  # the earliest another server's lease on a waiting job runs out
        self._leases_due = False  # the last full sweep found a job lease to take or renew
        self.observer = Observer(backend, logs, settings, OutputsGate(db, logs))
        self.starter = Starter(db, backend, self._inputs, logs, owner=self.owner)
        # (org id, spec) → the spec's inputs resolved to files (datasets and model versions).
        self.resolve_inputs = resolve_inputs
        # The admission latency of each job a pass starts, in seconds from its entering the queue (submitted,
        # preempted or restarting) to STARTING: read for all of the pass's jobs in one query.
        self.on_admitted = on_admitted
        self.on_ended = on_ended  # an attempt's end was recorded (a pipeline's next step may start now)

    # -- the background task --------------------------------------------------------------------------

    def wake(self, job_id: str | None = None) -> None:
        """Run a pass now. With a job id, that job's attempt changed (the shim said so) and is observed."""
        with self._dirty_lock:
            if job_id is not None:
                self._dirty.add(job_id)
            else:
                self._rescheduled = True
        self._wake.set()

    def task(self) -> Task:
        """The reconcile loop as a background task (kiln.tasks.runner): a pass every ``reconcile_interval``, or
        at once when woken. No lease scope: every server runs it, and it leases the jobs themselves row by row."""
        return Task("reconciler", self._pass, self.settings.reconcile_interval, wake=self._wake)

    def _pass(self, ctx: TaskContext) -> float | None:
        # A pass that left placements or preemptions sets the wake-up itself: the next pass follows at once.
        self.run_once(full=not ctx.woken)
        return self.until_takeover()

    def until_takeover(self) -> float | None:
        """Seconds to the next pass when another server's lease on a waiting job runs out before the interval is
        up (None: wait the interval). Only the lease's holder places a job, so when that server died the job waits
        for its lease to run out; the next pass is due then, not up to an interval later (issue 27: a dead
        server's jobs are placed within the TTL plus one pass, not the TTL plus the interval plus a pass)."""
        if self._next_takeover is None:
            return None
        wait = (self._next_takeover - utcnow()).total_seconds() + TAKEOVER_SLACK_SECONDS
        if wait >= self.settings.reconcile_interval:
            return None
        return max(TAKEOVER_SLACK_SECONDS, wait)

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
            rescheduled, self._rescheduled = self._rescheduled, False
            handed, self._handed = self._handed, []
        first, self._first_pass = self._first_pass, False
        full = full or first
        if handed:  # placed at submit: started before anything is observed
            self.starter.start([x for x, _ in handed], committed_at=min(at for _, at in handed))
            with self._dirty_lock:
                for x, _ in handed:
                    self._launching.pop((x.job_id, x.attempt), None)
        self._forget_launching(now)
        seen = [self.observer.look(job) for job in self._to_observe(full, dirty)]
        released = {x.job.id for x in seen if x.ended}
        # A pass woken only by running attempts that changed and none of which ended (a shim saying its command
        # runs) changes nothing a placement depends on: it writes what it saw without reading the queue (the
        # submit → RUNNING path's last step; issue 27). A woken job no longer active (a queued job cancelled)
        # may have held others back: that pass decides.
        decide = full or rescheduled or bool(released) or bool(self._leftover) or len(seen) < len(dirty)
        plan = self._plan(released) if decide else Plan()
        launches = self._write(seen, plan, full=full, first=first)
        self.starter.start(launches, committed_at=time.monotonic())
        if self._leftover:
            self._wake.set()  # more were placed than one pass starts: go again at once

    def launching(self, job_id: str, attempt: int) -> None:
        """A submit is placing this attempt (its transaction has not committed yet), and will hand it over
        (``hand_over``) once it has: until the pass that starts it, an observation of it launches nothing."""
        with self._dirty_lock:
            self._launching[(job_id, attempt)] = time.monotonic()

    def _about_to_start(self, job_id: str, attempt: int) -> bool:
        with self._dirty_lock:
            return (job_id, attempt) in self._launching

    def _forget_launching(self, now: float) -> None:
        """Attempts marked ``launching`` long ago: their submit never committed (or their start was lost)."""
        with self._dirty_lock:
            for key in [k for k, at in self._launching.items() if now - at > LAUNCHING_SECONDS]:
                del self._launching[key]

    def hand_over(self, launch: Launch) -> None:
        """Start an attempt a submit placed and committed STARTING under this server's lease
        (``kiln.scheduler.submit_placement``): the next pass starts it first, deciding nothing for it. A server
        that dies before that leaves it STARTING and never launched, which the next holder launches, as after a
        crash between a pass's commit and its starts."""
        with self._dirty_lock:
            self._handed.append((launch, time.monotonic()))
        self._wake.set()

    def _schedule(self) -> bool:
        """A scheduling pass alone (no observing): decide, write, start this pass's share of the placements. True
        when placements were left for the next pass."""
        launches = self._write([], self._plan(set()), full=False, first=False)
        self.starter.start(launches, committed_at=time.monotonic())
        return bool(self._leftover)

    # -- leases ---------------------------------------------------------------------------------------

    def _take_leases(self, s: Session) -> None:
        """Inside ``s``: take or renew the lease on every open job of this backend that nobody else holds (a
        takeover from another server writes its event on each job: ``kiln.scheduler.leases``)."""
        moved = take_job_leases(s, self.db.dialect, self.backend.name, self.owner, self.settings.lease_seconds)
        if moved:
            holders = ", ".join(sorted({previous for _, previous in moved}))
            log.info("took over %d job(s) whose leases %s stopped renewing", len(moved), holders)

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

    def _to_observe(self, full: bool, dirty: set[str]) -> list[Any]:
        """The active jobs this pass observes (rows of ``_OBSERVED``), read without a transaction that writes. A
        full sweep: every one this reconciler holds or may take (the pass's transaction takes the leases; a job
        another server took in between is left alone there), and whether any lease is due (``_leases_due``). A
        woken pass: the given jobs, where this reconciler holds their lease."""
        params: dict[str, Any] = {"owner": self.owner}
        if full:
            params |= {"backend": self.backend.name, "now": utcnow()}
        elif dirty:
            params["ids"] = sorted(dirty)
        else:
            return []
        with self.db.read() as s:
            rows = list(s.execute(_observed_statement(full), params))
            if full:
                self._leases_due = job_leases_due(s, self.backend.name, self.owner, self.settings.lease_seconds)
        return rows

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

    def _apply(self, s: Session, row: Job | None, seen: Seen) -> Launch | None:
        """Write what was seen of one attempt, if the row is still that attempt's and this server's: the outcome
        ``scheduler.outcome.decide`` gives, carried out through ``transition``; or, for an attempt never launched,
        the launch to make once the pass commits."""
        if row is None or row.attempt != seen.job.attempt or row.lease_owner != self.owner:
            return None  # handled elsewhere, or another server took the job: an attempt's end is applied once
        if not JobState(row.state).active:
            return None
        if seen.handle_changed:
            row.handle = seen.handle
        if seen.status is None:
            return None
        if seen.status.phase is Phase.UNLAUNCHED:
            if row.cancel_requested:  # the backend's cancel ends such an attempt; this is the record of it
                transition(s, row, JobState.CANCELLED, Reason.CANCELLED, "cancelled before it started")
                seen.keep_files = False
                return None
            if row.state == JobState.STARTING:
                if self._about_to_start(row.id, row.attempt):
                    return None  # placed by a submit a moment ago: the next pass starts it (``hand_over``)
                return self._relaunch(s, row, seen.status.message)
            # Running by the record, gone without a trace by the backend's: lost.
            seen.status = replace(seen.status, phase=Phase.LOST)
        observed = Observed(seen.status, seen.handle.get("preempt_sent_at"), seen.copied, seen.copy_error)
        spec = StoredSpec(row.spec).model
        backoff = self.settings.restart_backoff_seconds
        outcome = decide(JobView.of(row), spec, observed, now=utcnow(), restart_backoff_seconds=backoff)
        if outcome is not None:
            self._end_attempt(s, row, seen, outcome)
        return None

    def _relaunch(self, s: Session, row: Job, why: str) -> Launch | None:
        """Launch again an attempt recorded STARTING that nothing runs: the same attempt, its allocation and
        launch token kept; after MAX_LAUNCHES the job fails (a start that cannot succeed)."""
        handle = dict(row.handle or self.backend.handle_for(row.id, row.attempt))
        launches = int(handle.get("launches", 1))
        if launches >= MAX_LAUNCHES:
            message = f"attempt {row.attempt} could not be started in {launches} launches: {why}"
            transition(s, row, JobState.FAILED, Reason.BACKEND_ERROR, message)
            return None
        handle["launches"] = launches + 1
        row.handle = handle
        record(s, row, Reason.RELAUNCHED, f"attempt {row.attempt} was never launched ({why}); launching it now")
        slots = tuple(
            Slot(x["node"], x["cpus"], x["memory"], tuple(x["gpus"])) for x in (row.allocation or {}).get("slots", [])
        )
        if not slots:  # an allocation recorded before slots were: the whole allocation is one slot
            alloc = row.allocation or {}
            slots = (Slot("local", alloc.get("cpus", 0), alloc.get("memory"), tuple(alloc.get("gpus", ()))),)
        return self._launch_of(row, slots)

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
        if (outcome.started or outcome.state is JobState.RUNNING) and seen.status and seen.status.unbilled_seconds:
            unbill_usage(s, row.id, seen.status.unbilled_seconds, seen.status.running_at or utcnow())
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
            return Plan(starts=self._next_starts(), names=self._leftover_names, nodes=self._leftover_nodes)
        self._leftover = []
        now = utcnow()
        with self.db.read() as s:
            snap = gather(s, self.backend, now, released=released)
        # A job leased by another server is that server's to place; it still counts in nobody's queue here, until
        # its lease runs out (the next pass is due then: ``until_takeover``).
        mine = []
        self._next_takeover = None
        for p, j in zip(snap.pending, snap.queue, strict=True):
            if j.lease_owner in (None, self.owner) or j.lease_expires_at is None or j.lease_expires_at < now:
                mine.append(p)
            elif self._next_takeover is None or j.lease_expires_at < self._next_takeover:
                self._next_takeover = j.lease_expires_at
        if not mine:
            return Plan()
        snap.pending = mine
        decision = snap.decide(time.time(), self.settings.preemption)
        plan = Plan(rows=snap.by_id, names=snap.names, nodes=snap.nodes)
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
        self._leftover_nodes = snap.nodes
        self._leftover_at = time.monotonic()
        self._borrowers = {p.job_id: p.backfill_for for p in decision.placements if p.backfill_for}
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
        leases = full and self._leases_due  # (read by this sweep's observation: most find none due)
        if not (leases or first or writes or plan.writes):
            return []
        reattached = 0
        relaunches: list[Launch] = []
        # The usage holds and runs the pass's transitions end are written in one statement each (lifecycle).
        with self.db.transaction() as s, ends_in_bulk(s):
            if leases:
                self._take_leases(s)
            rows = self._rows(s, [x.job.id for x in (seen if first else writes)])
            if first:
                reattached = self._note_reattached(s, rows, seen)
            for x in writes:
                again = self._apply(s, rows.get(x.job.id), x)
                if again is not None:
                    relaunches.append(again)
            if plan.unschedulable:
                self._fail_waiting(s, plan.unschedulable)
            if plan.preemptions:
                self._request_preemptions(s, plan.preemptions)
            if plan.waiting:
                note_waiting(s, self.db.dialect, plan.waiting, plan.rows)
            launches = relaunches + self._mark_starting(s, plan.starts, plan.names, plan.nodes)
        if reattached:
            log.info("re-attached to %d running job(s)", reattached)
        if self.on_ended is not None and any(x.ended for x in writes):
            self.on_ended()
        for x in seen:
            for note in x.notes:
                self.logs.append_system(x.job.id, note, log_source(x.handle))
            if x.notes and x.ended:
                self.observer.ship_log(x.job, x.handle)
            # Its outputs and checkpoints are in the store, its end committed: its local files may go.
            if x.keep_files is not None and isinstance(self.backend, JobFiles):
                try:
                    self.backend.release(x.handle, x.keep_files)
                except Exception:
                    log.exception("job %s: freeing its local files failed", x.job.id)
        if plan.preemptions:  # the next observation of each victim warns and stops it
            with self._dirty_lock:
                self._dirty.update(plan.preemptions)
            self._wake.set()
        return launches

    def _note_reattached(self, s: Session, rows: dict[str, Job], seen: list[Seen]) -> int:
        """The first pass of a server: say, per active job, what it found of the attempt the row records. A
        supervisor alive: re-attached. An attempt that ended while no server ran: adopted with its outcome (the
        transition says which). Never launched, or lost: no re-attachment is claimed (``_apply`` says what)."""
        count = 0
        for x in seen:
            row = rows.get(x.job.id)
            if row is None or not JobState(row.state).active or row.lease_owner != self.owner:
                continue
            if row.attempt != x.job.attempt:
                continue
            phase = x.status.phase if x.status is not None else None
            if phase is None or phase in (Phase.STARTING, Phase.RUNNING):
                record(s, row, Reason.REATTACHED, f"server (re)started; re-attached to attempt {row.attempt}")
                count += 1
            elif phase is Phase.EXITED:
                record(s, row, Reason.ADOPTED, f"server (re)started; attempt {row.attempt} ended while it was down")
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

    def _mark_starting(
        self, s: Session, starts: list[tuple[Any, tuple[Slot, ...]]], names: dict[str, str], nodes: list[Node]
    ) -> list[Launch]:
        """Move this pass's placements to STARTING (each re-checked: still waiting, not another server's, not
        cancelled, still free on its nodes, admitted by its organisation's quota) and say what to start once that
        is committed."""
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
            if job.lease_owner not in (None, self.owner):  # its holder let the lease run out: a takeover
                note_takeovers(s, [(job.id, job.lease_owner)], self.owner, now=now)
            job.lease_owner = self.owner
            job.lease_expires_at = now + timedelta(seconds=self.settings.lease_seconds)
            if job.cancel_requested:
                transition(s, job, JobState.CANCELLED, Reason.CANCELLED, "cancelled before it started")
                continue
            placed.append((job, slots))
        # The decision's snapshot was read before this transaction: what a submit or another server placed since
        # is not placed over (kiln.scheduler.capacity).
        placed = still_free(s, self.db.dialect, self.backend.name, placed, nodes)
        if not placed:
            return []
        now = utcnow()  # after the lock: a start is never stamped before the end whose capacity it took
        admission = Admission(s, self.db.dialect, [job.org_id for job, _ in placed])
        entered = queued_at(s, [job.id for job, _ in placed]) if self.on_admitted is not None else {}
        launches = []
        for job, slots in placed:
            waiting = admission.admit(job, names.get(job.org_id) or job.org_id)
            if waiting:  # another scheduler admitted work for this organisation since the decision was made
                set_waiting(s, job, waiting)
                continue
            launches.append(self.starting(s, job, slots, now, self._borrowers.get(job.id)))
            if self.on_admitted is not None:
                since = entered.get(job.id) or job.created_at
                try:
                    self.on_admitted(max(0.0, (now - since).total_seconds()))
                except Exception:  # a metric must never stop a job from starting
                    log.exception("observing the admission latency failed")
        return launches

    def starting(
        self, s: Session, job: Job, slots: tuple[Slot, ...], now: datetime, backfill_for: str | None = None
    ) -> Launch:
        """Inside ``s``, which holds the placement lock and admitted the job: its next attempt STARTING on
        ``slots`` (``backfill_for``: the waiting job whose reserved resources it borrows), the launch it expects in
        its handle. What the backend is to start once ``s`` commits."""
        job.attempt += 1
        allocation = allocation_of(slots, backfill_for)
        job.allocation = allocation
        job.handle = {**self.backend.handle_for(job.id, job.attempt), "launch": new_id("lch")}
        job.not_before = None
        job.preempt_reason = None
        where = f"{allocation['cpus']:g} CPU(s)" + (f", GPUs {allocation['gpus']}" if allocation["gpus"] else "")
        if len(slots) > 1:
            where = f"{len(slots)} gang members, " + where
        transition(s, job, JobState.STARTING, Reason.SCHEDULED, f"attempt {job.attempt} placed on {where}", now=now)
        return self._launch_of(job, slots)

    def _launch_of(self, job: Job, slots: tuple[Slot, ...]) -> Launch:
        """What the backend needs to start the job's current attempt on ``slots`` (the launch its handle names)."""
        spec = StoredSpec(job.spec).model
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
            launch_id=(job.handle or {}).get("launch"),
            handle=dict(job.handle) if job.handle else None,
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
        spec_timeout = StoredSpec(job.spec).timeout
        ttl = self.settings.job_token_ttl_seconds
        if spec_timeout:
            ttl = min(ttl, spec_timeout + 3600)
        return self.mint_token(job.id, job.attempt, ttl)
