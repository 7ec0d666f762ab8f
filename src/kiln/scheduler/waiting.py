"""What a reconcile pass writes about jobs that wait: why each waits (in bulk for a long queue, an event only when
the kind of wait changes) and when each last entered the queue."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import String, Table, Text, bindparam, column, func, insert, or_, select, update, values
from sqlalchemy.orm import Session

from kiln.db.tables import Job, JobEvent, utcnow
from kiln.domain.states import JobState, Reason
from kiln.usecases.jobs.lifecycle import record

JOBS_TABLE = cast(Table, Job.__table__)
EVENTS_TABLE = cast(Table, JobEvent.__table__)
WAITING_STATES = (JobState.QUEUED, JobState.RESTARTING)


def set_waiting(s: Session, job: Job, why: str) -> None:
    """Say why a job waits. An event only when the kind of wait changes (queued → capacity → quota): a moving
    queue position or changing free numbers just update the message, so a long queue does not flood events."""
    before = (job.message or "").split(":", 1)[0]
    job.message = why
    if before != why.split(":", 1)[0]:
        record(s, job, "Waiting", why)


def note_waiting(s: Session, dialect: str, changed: dict[str, str], rows: dict[str, Any]) -> None:
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
    if dialect == "postgresql":
        # One UPDATE ... FROM (VALUES ...) per thousand rows: a round trip per row costs seconds here.
        for start in range(0, len(items), 1000):
            batch = values(column("b_id", String), column("b_message", Text), name="b").data(
                items[start : start + 1000]
            )
            conn.execute(update(JOBS_TABLE).where(jobs.id == batch.c.b_id, waiting).values(message=batch.c.b_message))
    else:  # SQLite: executemany of one prepared statement is cheap (no round trips)
        conn.execute(
            update(JOBS_TABLE).where(jobs.id == bindparam("b_id"), waiting).values(message=bindparam("b_message")),
            [{"b_id": job_id, "b_message": why} for job_id, why in items],
        )
    if events:
        conn.execute(insert(EVENTS_TABLE), events)


def queued_at(s: Session, job_ids: list[str]) -> dict[str, datetime]:
    """When each job last entered the queue (its latest event to QUEUED or RESTARTING)."""
    waiting = [str(x) for x in WAITING_STATES]
    query = (
        select(JobEvent.job_id, func.max(JobEvent.time))
        .where(JobEvent.job_id.in_(job_ids), JobEvent.to_state.in_(waiting))
        .group_by(JobEvent.job_id)
    )
    return {job_id: at for job_id, at in s.execute(query)}
