"""Reading what jobs leave behind: their logs and their artifacts."""

from __future__ import annotations

import time
from collections.abc import Iterator

from kiln.domain.schemas import ArtifactRead
from kiln.errors import NotFound
from kiln.scheduler.loop import outputs_prefix
from kiln.services.identity import Principal
from kiln.services.jobs import JobService
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore, safe_key


class OutputService:
    def __init__(self, jobs: JobService, logs: LogStore, store: ObjectStore) -> None:
        self.jobs = jobs
        self.logs = logs
        self.store = store

    def read_log(self, principal: Principal, job_id: str, offset: int, limit: int) -> tuple[bytes, int, bool]:
        """(whole lines from offset, next offset, whether the job has ended)."""
        ended = self.jobs.is_terminal(principal, job_id)
        data, next_offset = self.logs.read(job_id, offset, limit)
        return data, next_offset, ended

    def follow_log(self, principal: Principal, job_id: str, offset: int, poll: float = 0.2) -> Iterator[bytes]:
        """Log bytes as they are written, until the job has ended and everything was sent."""
        self.jobs.get(principal, job_id)  # 404 before the stream starts
        while True:
            ended = self.jobs.is_terminal(principal, job_id)
            while True:
                data, offset = self.logs.read(job_id, offset, 1024 * 1024)
                if not data:
                    break
                yield data
            if ended:
                return
            time.sleep(poll)

    def list_artifacts(self, principal: Principal, job_id: str) -> list[ArtifactRead]:
        job = self.jobs.get(principal, job_id)
        return [ArtifactRead(path=p, size=n) for p, n in self.store.list(outputs_prefix(job.org_id, job.id))]

    def artifact_key(self, principal: Principal, job_id: str, path: str) -> tuple[str, int]:
        job = self.jobs.get(principal, job_id)
        key = f"{outputs_prefix(job.org_id, job.id)}/{safe_key(path)}"
        if not self.store.exists(key):
            raise NotFound(f"job {job_id} has no artifact {path!r}")
        return key, self.store.size(key)
