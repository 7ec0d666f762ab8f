"""Deleting an ended job: its row, events and metrics, then its log, artifacts and checkpoints, so that what it
stored stops counting against the organisation's storage quota."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable

from sqlalchemy import delete
from sqlalchemy.orm import Session

from kiln.backends.base import Backend
from kiln.backends.capabilities import JobFiles, MetricSpools
from kiln.db.tables import Job, JobEvent, MetricCursor, OutputManifest
from kiln.domain.states import JobState
from kiln.errors import Conflict
from kiln.storage.keys import checkpoints_prefix, events_prefix, outputs_prefix
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import JobService
from kiln.usecases.jobs.run_rows import remove_run_rows

log = logging.getLogger(__name__)


class JobRemoval:
    def __init__(
        self,
        jobs: JobService,
        logs: LogStore,
        store: ObjectStore,
        backend: Backend | None = None,
        *,
        spools: MetricSpools | None = None,
        drain_metrics: Callable[[], object] | None = None,
    ) -> None:
        """``spools``: where jobs' metric spool files are (the backend's, or the server's own: those the metrics
        ingester reads); ``drain_metrics``: one pass of the metrics ingester, which waits for a pass under way."""
        self.jobs = jobs
        self.logs = logs
        self.store = store
        self.backend = backend
        self.spools = spools
        self.drain_metrics = drain_metrics

    def delete(self, principal: Principal, job_id: str) -> None:
        """Remove an ended job and everything it left. A job that has not ended is refused (409): its attempt
        would go on writing what is removed here."""
        principal.require("jobs:write")
        with self.jobs.db.read() as s:
            ended = self._check_ended(s, principal, job_id)
        # A job that ended moments ago may still have metric points on their way in: its spool goes first (where
        # its last attempt's server put it), then a pass of the ingester waits out one under way, so that no point
        # arrives for rows deleted below.
        if self.spools is not None:
            self.spools.remove_metric_spool(job_id, ended.handle)
        if self.drain_metrics is not None:
            self.drain_metrics()
        with self.jobs.db.transaction() as s:
            job = self._check_ended(s, principal, job_id, lock=True)
            org_id = job.org_id
            handle = dict(job.handle or {"job_id": job_id, "attempt": job.attempt})
            # The foreign keys cascade on both databases, but rows written through the bulk engine (SQLite
            # without foreign keys) would not: delete every dependent row by name.
            remove_run_rows(s, job_id)  # its run: params, tags, metric series
            s.execute(delete(MetricCursor).where(MetricCursor.job_id == job_id))
            s.execute(delete(JobEvent).where(JobEvent.job_id == job_id))
            s.execute(delete(OutputManifest).where(OutputManifest.job_id == job_id))
            s.expunge(job)
            s.execute(delete(Job).where(Job.id == job_id))
        # The row is gone (the job answers 404 and its output bytes no longer count): now its files.
        for prefix in (
            outputs_prefix(org_id, job_id),
            checkpoints_prefix(org_id, job_id),
            events_prefix(org_id, job_id),
        ):
            for rel, _ in self.store.list(prefix):
                self.store.delete(f"{prefix}/{rel}")
        local = self.store.local_path(outputs_prefix(org_id, job_id))
        if local is not None:  # a local store keeps the emptied directories
            shutil.rmtree(local.parent, ignore_errors=True)
        self.logs.remove(org_id, job_id)  # this server's file and the store's copy
        if isinstance(self.backend, JobFiles):
            try:
                self.backend.release(handle, keep=False)  # a failed job's work dir kept for debugging
            except Exception:
                log.exception("job %s: freeing its local files failed", job_id)

    def _check_ended(self, s: Session, principal: Principal, job_id: str, *, lock: bool = False) -> Job:
        job = self.jobs.load(s, principal, job_id, lock=lock)
        state = JobState(job.state)
        if not state.terminal:
            raise Conflict(f"job {job_id} is {state}; cancel it first (kiln jobs cancel {job_id})")
        return job
