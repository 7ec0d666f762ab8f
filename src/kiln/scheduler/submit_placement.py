"""Placing a job in its submit's own transaction, when nothing could make it wait (issue 45).

A submit records the job QUEUED and a reconcile pass places it: for a job that fits free capacity with nothing
ahead of it, that pass is pure delay (the "QUEUED → STARTING" stage of ``benchmarks/submit_latency.py``). So the
submit asks the decision function itself (``kiln.domain.placement.policy.decide``, through
``usecases.scheduler_inputs.gather``: the same inputs the loop reads, quotas, fair share and backfill included)
over a snapshot read inside its transaction, under the backend's placement lock (``kiln.scheduler.capacity``),
and when that decision starts the new job, moves it QUEUED → STARTING through the loop's own ``starting``
(the same ``transition``, the same admission, the lease taken by this server). After the commit the reconciler is
handed the launch (``Reconciler.hand_over``) and starts it, as it starts its own placements: the crash rules are
the loop's (a STARTING row names the launch it expects; whoever holds the lease launches or adopts it).

Anything uncertain sends the job to the queue as before, untouched: the switch off (``KILN_SUBMIT_FAST_PATH``),
another waiting job of its organisation (it is ahead), a queue longer than a submit should read, the placement
lock held by another placer (PostgreSQL), a decision that would preempt anyone or does not start this job, a
quota that says wait, or any error: the decision only reads (on PostgreSQL in a savepoint of the connection), and
what placing the job changes of it is put back where that fails.

The job's rows are added to the submit's transaction, not written, when it is placed: the decision reads the queue
as committed and adds the new job to it last, and the submit writes the job STARTING with both its events in one
flush (no INSERT then UPDATE of its row, no savepoint).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from kiln.backends.base import Slot
from kiln.db.tables import Job, utcnow
from kiln.domain.states import JobState
from kiln.scheduler.capacity import lock_placements
from kiln.scheduler.loop import Reconciler
from kiln.usecases.access.quotas import Admission
from kiln.usecases.jobs.scheduler_inputs import WAITING_STATES, gather_short

log = logging.getLogger(__name__)

# A submit reads the whole waiting queue to decide as the loop would; beyond this many waiting jobs that read is a
# pass's work, and the queue is busy anyway: the job goes to the queue.
MAX_QUEUE = 64
# A waiting job of the organisation other than this one (built once: a statement costs more to build than to run).
_AHEAD = (
    select(Job.id)
    .where(
        Job.org_id == bindparam("org_id"),
        Job.state.in_([str(x) for x in WAITING_STATES]),
        Job.id != bindparam("job_id"),
    )
    .limit(1)
)


class SubmitPlacement:
    """``place`` is JobService's ``place_now``: called in the submit's transaction with the new job's rows added and
    not yet written, so that the submit writes them once, QUEUED → STARTING events and all, in one flush."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.settings = reconciler.settings

    def place(self, s: Session, job: Job) -> Callable[[], None] | None:
        """Inside the submit's transaction ``s``: move ``job`` (new, not flushed) to STARTING if the decision starts
        it now. Returns what to call once ``s`` committed (hand the launch to the reconciler), or None: the job
        stays QUEUED and the caller wakes the reconciler as before."""
        if not self.settings.submit_fast_path or job.state != JobState.QUEUED or job.cancel_requested:
            return None
        try:
            with s.no_autoflush:  # the decision reads what is committed, and adds the new job to it
                decided = self._decide(s, job)
        except Exception:
            log.exception("job %s: placing it at submit failed; it goes to the queue", job.id)
            return None
        if decided is None:
            return None
        slots, backfill_for, now = decided
        rec = self.reconciler
        undo = _Undo(s, job)
        try:
            job.lease_owner = rec.owner
            job.lease_expires_at = now + timedelta(seconds=self.settings.lease_seconds)
            launch = rec.starting(s, job, slots, now, backfill_for)
        except Exception:
            undo()
            log.exception("job %s: placing it at submit failed; it goes to the queue", job.id)
            return None
        if rec.on_admitted is not None:
            try:
                rec.on_admitted(max(0.0, (now - job.created_at).total_seconds()))
            except Exception:  # a metric must never stop a job from starting
                log.exception("observing the admission latency failed")
        # From before the commit: a pass that observes the attempt first leaves its start to the hand-over.
        rec.launching(job.id, job.attempt)
        return lambda: rec.hand_over(launch)

    def _decide(self, s: Session, job: Job) -> tuple[tuple[Slot, ...], str | None, datetime] | None:
        """Reads only (under the placement lock it takes): where the decision places ``job`` now, or None. On
        PostgreSQL in a savepoint of the connection (not of the session: the new job's rows stay unwritten), so
        that a read that fails leaves the submit's transaction usable."""
        savepoint = s.connection().begin_nested() if self.reconciler.db.dialect == "postgresql" else None
        try:
            decided = self._read_and_decide(s, job)
        except BaseException:
            if savepoint is not None:
                savepoint.rollback()
            raise
        if savepoint is not None:
            savepoint.commit()  # (its locks are the transaction's until it ends)
        return decided

    def _read_and_decide(self, s: Session, job: Job) -> tuple[tuple[Slot, ...], str | None, datetime] | None:
        rec = self.reconciler
        if s.connection().execute(_AHEAD, {"org_id": job.org_id, "job_id": job.id}).first() is not None:
            return None  # its organisation's queue comes first (FIFO within an organisation)
        if not lock_placements(s, rec.db.dialect, rec.backend.name, wait=False):
            return None  # another placer is writing: the queue decides, seeing what it placed
        now = utcnow()
        # Under the lock: what every committed placement left free, and the queue with the new job last. None: a
        # longer queue than a submit reads.
        snap = gather_short(s, rec.backend, now, MAX_QUEUE, new=job)
        if snap is None or not snap.nodes:
            return None  # the queue is busy, or capacity unknown
        decision = snap.decide(time.time(), self.settings.preemption)
        mine = next((p for p in decision.placements if p.job_id == job.id), None)
        if mine is None or decision.preemptions:
            return None
        name = snap.names.get(job.org_id) or job.org_id
        if Admission(s, rec.db.dialect, [job.org_id]).admit(job, name):
            return None
        slots = tuple(Slot(w.node, w.cpus, w.memory, w.gpus) for w in mine.workers)
        return slots, mine.backfill_for, now


class _Undo:
    """Puts a new, unflushed job back as it was (its columns, and no row added to the session since): a placement
    that failed half-way leaves the job queued, as if it had never been tried."""

    def __init__(self, s: Session, job: Job) -> None:
        self.s = s
        self.job = job
        self.columns = {c.key: getattr(job, c.key) for c in sa_inspect(Job).column_attrs}
        self.pending = set(s.new)

    def __call__(self) -> None:
        for row in [row for row in self.s.new if row not in self.pending]:
            self.s.expunge(row)
        for key, value in self.columns.items():
            setattr(self.job, key, value)
