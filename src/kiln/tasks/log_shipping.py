"""Job logs readable through every server: every ``log_ship_seconds`` each server ships to the store what it wrote
of the logs of the running jobs it holds (kiln.storage.logs), and records the size shipped on the job's row, so
that the organisation's storage quota counts it on every server. The reconciler ships an attempt's whole log
before it records its end; a ship that failed then (a store that is down) is tried again here.

No lease scope: every server ships the logs it writes, the jobs it holds the lease of (their rows are written
only while it still holds them)."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select, update

from kiln.db.session import Database
from kiln.db.tables import Job
from kiln.domain.states import JobState
from kiln.storage.logs import LogStore
from kiln.tasks.runner import Task, TaskContext

log = logging.getLogger(__name__)

ACTIVE = [str(JobState.STARTING), str(JobState.RUNNING)]


class LogShipping:
    def __init__(self, db: Database, logs: LogStore, owner: str, interval: float) -> None:
        """``owner``: this server's instance id, the reconciler's lease owner."""
        self.db = db
        self.logs = logs
        self.owner = owner
        self.interval = interval

    def task(self) -> Task | None:
        """A round every ``interval`` (None with no store to ship to, or shipping off: 0)."""
        if self.logs.store is None or self.interval <= 0:
            return None
        return Task("log-shipping", self._round, self.interval, first_delay=self.interval)

    def _round(self, ctx: TaskContext) -> None:
        self.run_once(ctx)

    def run_once(self, ctx: TaskContext | None = None) -> int:
        """One round; how many jobs' logs grew in the store."""
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.org_id, Job.log_bytes, Job.handle).where(
                    Job.state.in_(ACTIVE), Job.lease_owner == self.owner
                )
            ).all()
        grown: dict[str, int] = {}
        for job_id, org_id, recorded, handle in rows:
            if ctx is not None and ctx.stopping.is_set():
                break
            # The file the attempt writes (its handle names it where the backend does: kiln.scheduler.loop).
            named = (handle or {}).get("log")
            source = Path(named) if isinstance(named, str) else self.logs.path(job_id)
            try:
                if source.stat().st_size <= (recorded or 0):
                    continue  # nothing new since the last ship (what the row records)
            except FileNotFoundError:
                continue
            try:
                shipped = self.logs.ship(org_id, job_id, source=source)
            except Exception as exc:  # a store that is down: the next round tries again
                log.warning("job %s: shipping its log to the store failed: %s", job_id, exc)
                continue
            if shipped > (recorded or 0):
                grown[job_id] = shipped
        for org_id, job_id in sorted(self.logs.unshipped):
            try:
                self.logs.ship(org_id, job_id, final=True)
                self.logs.unshipped.discard((org_id, job_id))
            except Exception as exc:
                log.warning("job %s: shipping its log to the store failed again: %s", job_id, exc)
        if grown:
            with self.db.transaction() as s:
                # Only the rows no pass holds now (SKIP LOCKED): the reconciler's pass locks its jobs' rows (the
                # leases it takes, then the rows it writes, in id order), and waiting here for one while holding
                # another deadlocked on PostgreSQL. A row skipped is recorded at the next round, or by the end.
                free = s.scalars(
                    select(Job.id)
                    .where(Job.id.in_(sorted(grown)), Job.lease_owner == self.owner, Job.state.in_(ACTIVE))
                    .order_by(Job.id)
                    .with_for_update(skip_locked=True)
                ).all()
                for job_id in free:
                    s.execute(
                        update(Job)
                        .where(Job.id == job_id, Job.log_bytes < grown[job_id])
                        .values(log_bytes=grown[job_id])
                    )
        return len(grown)
