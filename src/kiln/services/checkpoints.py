"""Checkpoints outlive the machine: while jobs run, what changed in their $KILN_CHECKPOINT_DIR is copied into the
store every ``checkpoint_sync_seconds`` (and once more when each attempt ends, by the reconciler). A thread of its
own, so that copying a large checkpoint never delays the reconcile loop."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select

from kiln.backends.base import Backend
from kiln.db.models import Job
from kiln.db.session import Database
from kiln.domain.states import JobState
from kiln.storage.keys import checkpoints_prefix

log = logging.getLogger(__name__)


class CheckpointSync:
    def __init__(self, db: Database, backend: Backend, interval: float) -> None:
        self.db = db
        self.backend = backend
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> int:
        """One round over the running jobs; files copied."""
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.org_id).where(Job.backend == self.backend.name, Job.state == JobState.RUNNING)
            ).all()
        total = 0
        for job_id, org_id in rows:
            if self._stop.is_set():
                break
            try:
                files, _ = self.backend.sync_checkpoints(job_id, checkpoints_prefix(org_id, job_id))
                total += files
            except Exception as exc:  # a store that is down: try again next round
                log.warning("job %s: keeping checkpoints in the store failed: %s", job_id, exc)
        return total

    def start(self) -> None:
        if self.interval <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="kiln-checkpoints", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except Exception:
                log.exception("checkpoint sync round failed")
