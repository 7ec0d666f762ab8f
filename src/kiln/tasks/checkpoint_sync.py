"""Checkpoints outlive the machine: while jobs run, what changed in their $KILN_CHECKPOINT_DIR is copied into the
store every ``checkpoint_sync_seconds`` (and once more when each attempt ends, by the reconciler). A background
task of its own (kiln.tasks.runner), so that copying a large checkpoint never delays the reconcile loop. Each
job by the server holding its lease (the one whose reconciler watches it: with several servers, not each of
them), from its attempt's own files (which another server may have started, on this machine).

``EventSync`` is the same round for TensorBoard event files, every ``tensorboard_sync_seconds``: what ``kiln
tensorboard`` shows of a running job.

Both count what the store then holds for the job in its organisation's storage quota, checked and reserved before
a byte is written (kiln.usecases.data.storage_gate): past the quota a job's new checkpoints are not kept, and it runs
on."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import select

from kiln.backends.base import Backend
from kiln.backends.capabilities import CheckpointSyncer, EventSyncer
from kiln.db.session import Database
from kiln.db.tables import Job
from kiln.domain.states import JobState
from kiln.storage.logs import LogStore
from kiln.tasks.runner import Task, TaskContext
from kiln.usecases.data.storage_gate import StorageGate, sync_checkpoints, sync_events

log = logging.getLogger(__name__)


class CheckpointSync:
    name = "checkpoint-sync"
    what = "checkpoints"
    capability: type = CheckpointSyncer

    def __init__(
        self,
        db: Database,
        backend: Backend,
        interval: float,
        owner: str | None = None,
        logs: LogStore | None = None,
    ) -> None:
        """``owner``: this server in the jobs' leases (None: every running job). ``logs``: the job logs, whose
        running jobs' sizes count in the storage quota."""
        self.db = db
        self.gate = StorageGate(db, logs)
        self.owner = owner
        self.backend = backend
        self.interval = interval
        self._stop = threading.Event()

    def task(self) -> Task | None:
        """A round every ``interval`` (None when syncing is off: ``checkpoint_sync_seconds`` 0, or a backend
        whose jobs upload their checkpoints themselves)."""
        if self.interval <= 0 or not isinstance(self.backend, self.capability):
            return None
        return Task(self.name, self._round, self.interval, first_delay=self.interval)

    def _round(self, ctx: TaskContext) -> None:
        self._stop = ctx.stopping  # a long round ends between jobs when the server stops
        self.run_once()

    def run_once(self) -> int:
        """One round over the running jobs; files copied."""
        if not isinstance(self.backend, self.capability):
            return 0
        with self.db.read() as s:
            query = select(Job.id, Job.org_id, Job.attempt, Job.handle).where(
                Job.backend == self.backend.name, Job.state == JobState.RUNNING
            )
            if self.owner is not None:
                query = query.where(Job.lease_owner == self.owner)
            rows = s.execute(query).all()
        total = 0
        for job_id, org_id, attempt, handle in rows:
            if self._stop.is_set():
                break
            try:
                handle = dict(handle or {"job_id": job_id, "attempt": attempt})
                total += self.sync(handle, org_id, job_id)
            except Exception as exc:  # a store that is down: try again next round
                log.warning("job %s: keeping %s in the store failed: %s", job_id, self.what, exc)
        return total

    def sync(self, handle: dict[str, Any], org_id: str, job_id: str) -> int:
        assert isinstance(self.backend, CheckpointSyncer)
        return sync_checkpoints(self.backend, self.gate, handle, org_id, job_id)


class EventSync(CheckpointSync):
    name = "event-sync"
    what = "TensorBoard event files"
    capability = EventSyncer

    def sync(self, handle: dict[str, Any], org_id: str, job_id: str) -> int:
        assert isinstance(self.backend, EventSyncer)
        return sync_events(self.backend, self.gate, handle, org_id, job_id)
