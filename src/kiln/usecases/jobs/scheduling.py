"""``why``: where a job stands in the scheduler's eyes. It runs the same decision the loop runs, on the same
inputs (``services.scheduler_inputs.gather``), so the answer is what the scheduler would do now.

Tenancy: a waiting job may be held back by other organisations' jobs; those are counted, never named, and
their ids are taken out of the messages shown to anyone outside their organisation.
"""

from __future__ import annotations

import time

from sqlalchemy import select

from kiln.backends.base import Backend
from kiln.db.session import Database
from kiln.db.tables import Job, utcnow
from kiln.domain.schemas import WhyAhead, WhyRead
from kiln.domain.states import JobState
from kiln.settings import Settings
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.jobs.scheduler_inputs import JOB_ID, gather, redact

PRIORITY_NAMES = {0: "low", 1: "normal", 2: "high"}


class SchedulingService:
    def __init__(self, db: Database, backend: Backend, settings: Settings, jobs: JobService) -> None:
        self.db = db
        self.backend = backend
        self.settings = settings
        self.jobs = jobs

    def why(self, principal: Principal, job_id: str) -> WhyRead:
        principal.require("jobs:read")
        now = utcnow()
        with self.db.read() as s:
            job = self.jobs.load(s, principal, job_id)
            state = JobState(job.state)
            base = WhyRead(
                job_id=job.id,
                state=state,
                waiting=False,
                message="",
                priority=PRIORITY_NAMES.get(job.priority, "normal"),  # type: ignore[arg-type]
            )
            if state not in (JobState.QUEUED, JobState.RESTARTING):
                base.message = _not_waiting(job)
                return base
            if job.not_before is not None and job.not_before > now:
                left = (job.not_before - now).total_seconds()
                base.waiting, base.kind = True, "backoff"
                base.message = f"backoff: restart {job.restarts} waits {left:.1f}s more before it is placed again"
                return base
            snap = gather(s, self.backend, now)
            decision = snap.decide(time.time(), self.settings.preemption)
            wait = decision.waiting.get(job.id)
            ids = set(wait.ahead) if wait else set()
            ids |= set(JOB_ID.findall(wait.message)) if wait else set()
            owners = {
                row.id: (row.org_id, row.name)
                for row in s.execute(select(Job.id, Job.org_id, Job.name).where(Job.id.in_(ids)))
            }
        viewer = None if principal.platform_admin else principal.org_id
        org_of = {k: v[0] for k, v in owners.items()}
        base.waiting = True
        base.queue_length = len(decision.waiting)
        if job.id in decision.unschedulable:
            base.kind, base.message = "unschedulable", f"unschedulable: the job {decision.unschedulable[job.id]}"
        elif any(p.job_id == job.id for p in decision.placements):
            base.kind, base.message = None, "fits now: the next scheduling pass starts it"
        elif wait is not None:
            base.kind = wait.kind
            base.message = redact(wait.message, viewer, org_of)
            base.position = wait.position
            for other in wait.ahead:
                owner, name = owners.get(other, ("", ""))
                if viewer is None or owner == viewer:
                    base.ahead.append(WhyAhead(id=other, name=name))
                else:
                    base.ahead.append(WhyAhead(other_org=True))
        else:  # leased by another server, whose pass decides it
            base.message = job.message or "queued"
        return base


def _not_waiting(job: Job) -> str:
    state = JobState(job.state)
    alloc = job.allocation or {}
    if state is JobState.STARTING:
        return f"starting: attempt {job.attempt} placed ({alloc.get('cpus', 0):g} CPUs, GPUs {alloc.get('gpus', [])})"
    if state is JobState.RUNNING:
        extra = f"; preemption requested: {job.preempt_reason}" if job.preempt_reason else ""
        return f"running: attempt {job.attempt} since {job.running_at:%Y-%m-%d %H:%M:%S} UTC{extra}"
    return f"{state.value.lower()}: {job.reason or ''}{': ' + job.message if job.message else ''}"
