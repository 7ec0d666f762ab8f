"""The one way a job's state changes: ``create_job`` puts a new job in its first state, ``transition`` moves it
(checking the FROM→TO table), both stamping times and writing the job's event; ``record`` notes what changes no
state.

A writer of many transitions in one transaction (a reconcile pass ending a burst of attempts) opens
``ends_in_bulk``: inside it, what a transition writes to other tables as a job releases its hold or ends (the usage
hold closed, the job's run ended) is collected and written when the block ends, one statement for all of them, in
the same transaction (so committed with the transitions, or not at all)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, update
from sqlalchemy.orm import Session

from kiln.db.tables import Job, JobEvent, Run, utcnow
from kiln.domain.states import TRANSITIONS, JobState, Reason
from kiln.errors import IllegalTransition
from kiln.usecases.notifications.notification_outbox import job_ended
from kiln.usecases.usage.usage import close_usage, close_usage_many, open_usage

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
            ends = session.info.get(_ENDS)
            if ends is not None and job.id in ends.closes:
                write_ends(session)  # its last hold closed first: the close is of that one, not of this
            open_usage(session, job, now)
    if to is JobState.RUNNING:
        job.running_at = now
    if to in (JobState.RESTARTING, JobState.QUEUED) or to.terminal:
        if job.allocation and session.info.get("metering", True):
            ends = session.info.get(_ENDS)
            if ends is not None:
                ends.closes[job.id] = now.timestamp()
            else:
                close_usage(session, job.id, now)  # released: its hold ends now
        job.allocation = None
    if to.terminal:
        job.finished_at = now
        job.lease_owner = None
        job.lease_expires_at = None
        # The job's run ends with it (searched and sorted by its end time like a run logged from outside).
        ends = session.info.get(_ENDS)
        if ends is not None:
            ends.runs[job.id] = int(now.timestamp() * 1000)
        else:
            session.execute(update(Run).where(Run.id == job.id).values(end_time=int(now.timestamp() * 1000)))
    event = JobEvent(job_id=job.id, time=now, from_state=current, to_state=to, reason=reason, message=message)
    session.add(event)
    if to.terminal:  # its notifications: in the outbox, committed with the end or not at all
        job_ended(session, job, event)
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


_ENDS = "kiln.lifecycle.ends"  # session.info: the _Ends of an open ``ends_in_bulk``


@dataclass
class _Ends:
    closes: dict[str, float] = field(default_factory=dict)  # job id → when its usage hold ends (epoch seconds)
    runs: dict[str, int] = field(default_factory=dict)  # job id → its run's end_time (epoch milliseconds)


@contextmanager
def ends_in_bulk(session: Session) -> Iterator[None]:
    """Inside: the usage holds that transitions close and the runs they end are written when the block ends, in
    one statement each (and before a job whose hold was closed here opens its next one). Nested: the outermost
    block writes. An exception inside writes nothing (the caller's transaction rolls back)."""
    if _ENDS in session.info:
        yield
        return
    session.info[_ENDS] = _Ends()
    try:
        yield
        write_ends(session)
    finally:
        session.info.pop(_ENDS, None)


def write_ends(session: Session) -> None:
    """Write what ``ends_in_bulk`` collected so far (the rows it reads and updates flushed first)."""
    ends: _Ends | None = session.info.get(_ENDS)
    if ends is None or not (ends.closes or ends.runs):
        return
    closes, runs = list(ends.closes.items()), list(ends.runs.items())
    ends.closes, ends.runs = {}, {}
    session.flush()
    close_usage_many(session, closes)
    if runs:
        table = cast(Table, Run.__table__)
        statement = update(table).where(table.c.id == bindparam("b_id")).values(end_time=bindparam("b_end"))
        session.execute(statement, [{"b_id": job_id, "b_end": end} for job_id, end in runs])
