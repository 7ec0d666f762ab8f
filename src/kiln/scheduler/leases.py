"""The reconciler's leases on jobs (``jobs.lease_owner``, ``jobs.lease_expires_at``): which server works on which
open job. Every full sweep a server takes the jobs nobody holds, renews its own when half their lease is gone, and
takes over those whose holder let the lease run out (the holder died, or stalled past it: a paused process).

A takeover is written on every job it moves, as an event of its own (``TakenOver``: "Adopted by B after A stopped
renewing"), in the transaction that moves the lease: without it a job run by two servers in turn said nothing of
it (a single server's restart says ``Reattached``), and who ran it when could only be read off the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from kiln.db.tables import Job, utcnow
from kiln.domain.states import JobState, Reason
from kiln.usecases.jobs.lifecycle import record_each

OPEN_STATES = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING]


def takeover_message(owner: str, previous: str) -> str:
    return f"Adopted by {owner} after {previous} stopped renewing"


def note_takeovers(s: Session, moved: Iterable[tuple[str, str]], owner: str, *, now: datetime | None = None) -> int:
    """Inside the transaction that moves the leases: one ``TakenOver`` event per (job id, previous holder). The
    number written."""
    events = [(job_id, str(Reason.TAKEN_OVER), takeover_message(owner, previous)) for job_id, previous in moved]
    return len(record_each(s, events, now=now))


def _claimable(backend: str, owner: str, now: datetime, lease_seconds: float) -> tuple[Any, ...]:
    """The open jobs of ``backend`` whose lease ``owner`` takes or renews now: nobody's, run out, or its own with
    half of it gone."""
    renew_before = now + timedelta(seconds=lease_seconds / 2)
    return (
        Job.state.in_([str(x) for x in OPEN_STATES]),
        Job.backend == backend,
        or_(
            Job.lease_owner.is_(None),
            Job.lease_expires_at < now,
            (Job.lease_owner == owner) & (Job.lease_expires_at < renew_before),
        ),
    )


def job_leases_due(s: Session, backend: str, owner: str, lease_seconds: float) -> bool:
    """Is there a lease for ``take_job_leases`` to take or renew now? A read: most sweeps find none (a new lease is
    renewed after half of it), and then need no write transaction for the leases."""
    claimable = _claimable(backend, owner, utcnow(), lease_seconds)
    return s.scalar(select(Job.id).where(*claimable).limit(1)) is not None


def take_job_leases(s: Session, dialect: str, backend: str, owner: str, lease_seconds: float) -> list[tuple[str, str]]:
    """Inside ``s``: take or renew the lease on every open job of ``backend`` that nobody else holds, writing the
    takeover of each job whose lease another server let run out. Returns those (job id, previous holder)."""
    now = utcnow()
    expires = now + timedelta(seconds=lease_seconds)
    claimable = _claimable(backend, owner, now, lease_seconds)
    if dialect == "postgresql":
        # Rows another transaction holds are skipped (that server is renewing or placing them): waiting for them
        # could deadlock two servers' passes.
        rows = s.execute(select(Job.id, Job.lease_owner).where(*claimable).with_for_update(skip_locked=True)).all()
        if rows:
            s.execute(
                update(Job).where(Job.id.in_([r.id for r in rows])).values(lease_owner=owner, lease_expires_at=expires)
            )
    else:
        # SQLite: the transaction holds the write lock already, so what this reads stays true until the update. Only
        # the other servers' rows are read; the update of the rest is one statement, however many jobs there are.
        rows = s.execute(
            select(Job.id, Job.lease_owner).where(*claimable, Job.lease_owner.is_not(None), Job.lease_owner != owner)
        ).all()
        s.execute(update(Job).where(*claimable).values(lease_owner=owner, lease_expires_at=expires))
    moved = [(r.id, r.lease_owner) for r in rows if r.lease_owner not in (None, owner)]
    note_takeovers(s, moved, owner, now=now)
    return moved
