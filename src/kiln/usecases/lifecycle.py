"""The one way a job's state changes: ``create_job`` puts a new job in its first state, ``transition`` moves it
(checking the FROM→TO table), both stamping times and writing the job's event; ``record`` notes what changes no
state."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session

from kiln.db.tables import Job, JobEvent, Run, utcnow
from kiln.domain.states import TRANSITIONS, JobState, Reason
from kiln.errors import IllegalTransition
from kiln.usecases.usage import close_usage, open_usage

# Where every job starts: in the queue, placed by the reconciler (its first event has no FROM state).
INITIAL_STATE = JobState.QUEUED


def create_job(session: Session, job: Job, message: str, *, now: datetime | None = None) -> JobEvent:
    """Enter ``job`` (a new row) in the state machine: QUEUED, reason Submitted, created now, with its first event
    (``message`` says by whom). Adds both to ``session``; the caller's transaction commits them. A row that has a
    state already is not new: IllegalTransition."""
    if job.state is not None:
        raise IllegalTransition(f"job {job.id}: already {job.state}; only a new job is created")
    now = now or utcnow()
    job.state = INITIAL_STATE
    job.reason = Reason.SUBMITTED
    job.message = ""
    job.created_at = now
    job.updated_at = now
    event = JobEvent(
        job_id=job.id, time=now, from_state=None, to_state=INITIAL_STATE, reason=Reason.SUBMITTED, message=message
    )
    session.add_all([job, event])
    return event


def transition(
    session: Session,
    job: Job,
    to: JobState,
    reason: str,
    message: str = "",
    *,
    now: datetime | None = None,
) -> JobEvent:
    """Move ``job`` to ``to`` or raise IllegalTransition; the caller's transaction commits both."""
    current = JobState(job.state)
    if to not in TRANSITIONS[current]:
        raise IllegalTransition(f"job {job.id}: {current} → {to} is not allowed")
    now = now or utcnow()
    job.state = to
    job.reason = reason
    job.message = message
    job.updated_at = now
    if to is JobState.STARTING:  # a new attempt: what the job row says of an attempt is about this one
        job.started_at = job.started_at or now
        job.running_at = None
        job.exit_code = None
        if job.allocation and session.info.get("metering", True):  # placed: metered from now (usecases.usage)
            open_usage(session, job, now)
    if to is JobState.RUNNING:
        job.running_at = now
    if to in (JobState.RESTARTING, JobState.QUEUED) or to.terminal:
        if job.allocation and session.info.get("metering", True):
            close_usage(session, job.id, now)  # released: its hold ends now
        job.allocation = None
    if to.terminal:
        job.finished_at = now
        job.lease_owner = None
        job.lease_expires_at = None
        # The job's run ends with it (searched and sorted by its end time like a run logged from outside).
        session.execute(update(Run).where(Run.id == job.id).values(end_time=int(now.timestamp() * 1000)))
    event = JobEvent(job_id=job.id, time=now, from_state=current, to_state=to, reason=reason, message=message)
    session.add(event)
    return event


def record(session: Session, job: Job, reason: str, message: str = "") -> JobEvent:
    """An event that changes no state (a waiting reason, a re-attachment, a cancel request)."""
    event = JobEvent(job_id=job.id, time=utcnow(), reason=reason, message=message)
    session.add(event)
    return event


def record_each(
    session: Session, events: Iterable[tuple[str, str, str]], *, now: datetime | None = None
) -> list[JobEvent]:
    """``record`` for jobs known by id only, in bulk: one event per (job id, reason, message), none of which
    changes a state (a takeover of many jobs' leases, written in the transaction that moves them)."""
    now = now or utcnow()
    made = [JobEvent(job_id=job_id, time=now, reason=reason, message=message) for job_id, reason, message in events]
    session.add_all(made)
    return made
