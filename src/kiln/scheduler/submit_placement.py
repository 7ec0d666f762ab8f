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
quota that says wait, or any error (the attempt runs in a savepoint rolled back whole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.backends.base import Launch, Slot
from kiln.db.tables import Job, utcnow
from kiln.domain.states import JobState
from kiln.scheduler.capacity import lock_placements
from kiln.scheduler.loop import Reconciler
from kiln.usecases.quotas import Admission
from kiln.usecases.scheduler_inputs import WAITING_STATES, gather

log = logging.getLogger(__name__)

# A submit reads the whole waiting queue to decide as the loop would; beyond this many waiting jobs that read is a
# pass's work, and the queue is busy anyway: the job goes to the queue.
MAX_QUEUE = 64


class SubmitPlacement:
    """``place`` is JobService's ``place_now``: called in the submit's transaction after the job's row is flushed."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.settings = reconciler.settings

    def place(self, s: Session, job: Job) -> Callable[[], None] | None:
        """Inside the submit's transaction ``s``: move ``job`` to STARTING if the decision starts it now. Returns
        what to call once ``s`` committed (hand the launch to the reconciler), or None: the job stays QUEUED and
        the caller wakes the reconciler as before."""
        if not self.settings.submit_fast_path or job.state != JobState.QUEUED or job.cancel_requested:
            return None
        try:
            with s.begin_nested():  # any failure undoes this attempt alone, never the submit
                launch = self._place(s, job)
        except Exception:
            log.exception("job %s: placing it at submit failed; it goes to the queue", job.id)
            return None
        if launch is None:
            return None
        reconciler = self.reconciler
        return lambda: reconciler.hand_over(launch)

    def _place(self, s: Session, job: Job) -> Launch | None:
        rec = self.reconciler
        waiting = [str(x) for x in WAITING_STATES]
        ahead = s.scalar(
            select(Job.id).where(Job.org_id == job.org_id, Job.state.in_(waiting), Job.id != job.id).limit(1)
        )
        if ahead is not None:
            return None  # its organisation's queue comes first (FIFO within an organisation)
        queued = s.scalars(
            select(Job.id).where(Job.backend == rec.backend.name, Job.state.in_(waiting)).limit(MAX_QUEUE + 1)
        ).all()
        if len(queued) > MAX_QUEUE:
            return None
        if not lock_placements(s, rec.db.dialect, rec.backend.name, wait=False):
            return None  # another placer is writing: the queue decides, seeing what it placed
        now = utcnow()
        snap = gather(s, rec.backend, now)  # under the lock: what every committed placement left free
        if not snap.nodes:
            return None  # capacity unknown
        decision = snap.decide(time.time(), self.settings.preemption)
        mine = next((p for p in decision.placements if p.job_id == job.id), None)
        if mine is None or decision.preemptions:
            return None
        name = snap.names.get(job.org_id) or job.org_id
        if Admission(s, rec.db.dialect, [job.org_id]).admit(job, name):
            return None
        job.lease_owner = rec.owner
        job.lease_expires_at = now + timedelta(seconds=self.settings.lease_seconds)
        slots = tuple(Slot(w.node, w.cpus, w.memory, w.gpus) for w in mine.workers)
        launch = rec.starting(s, job, slots, now, mine.backfill_for)
        if rec.on_admitted is not None:
            try:
                rec.on_admitted(max(0.0, (now - job.created_at).total_seconds()))
            except Exception:  # a metric must never stop a job from starting
                log.exception("observing the admission latency failed")
        return launch
