"""A run's artifacts, as MLflow's client logs, lists and downloads them (``mlflow-artifacts``): a job's run's are
its outputs (what the job writes to ``$KILN_OUTPUT_DIR`` and uploads with its token: one place for both), a run
logged from outside Kiln keeps them under ``orgs/<org>/runs/<run>/artifacts``, counted against the organisation's
storage quota (``runs.artifact_bytes``).

Paths are MLflow's: ``<experiment id>/<run id>/artifacts/<path in the run>``. Reading needs what reading the run
needs; writing what logging to it needs (a job's artifacts come from the job itself, while it runs).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import update
from starlette.concurrency import run_in_threadpool

from kiln.db.tables import Run
from kiln.errors import InvalidInput, NotFound
from kiln.storage.keys import outputs_prefix, run_artifacts_prefix
from kiln.storage.store import ObjectStore, safe_key
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService
from kiln.usecases.data.outputs import OutputService
from kiln.usecases.tracking.tracking import TrackingService

QUOTA_CHECK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ArtifactEntry:
    path: str  # relative to the directory listed
    is_dir: bool
    size: int | None


@dataclass(frozen=True)
class _Place:
    run: Run
    prefix: str  # the run's artifacts in the store
    rel: str  # the path asked for, inside them ("" for their root)


class RunArtifacts:
    def __init__(
        self, tracking: TrackingService, outputs: OutputService, store: ObjectStore, tmp_dir: Path, quotas: QuotaService
    ) -> None:
        self.tracking = tracking
        self.outputs = outputs
        self.store = store
        self.tmp_dir = tmp_dir
        self.quotas = quotas

    def _place(self, principal: Principal, path: str, *, write: bool = False) -> _Place:
        parts = path.strip("/").split("/")
        if len(parts) < 3 or parts[2] != "artifacts":
            raise InvalidInput(f"{path[:200]!r}: an artifact path is <experiment id>/<run id>/artifacts[/<path>]")
        rel = "/".join(parts[3:])
        if rel:
            rel = safe_key(rel)  # BadRequest for a path that would leave the run's artifacts
        if not write:
            self.tracking._may_read(principal)
        with self.tracking.db.read() as s:
            run = self.tracking._run(s, principal, parts[1])
            s.expunge(run)
        if run.experiment_id != parts[0]:
            raise NotFound(f"run {run.id} is not in experiment {parts[0]}")
        if write:
            self.tracking._may_write(principal, run)
        prefix = outputs_prefix(run.org_id, run.job_id) if run.job_id else run_artifacts_prefix(run.org_id, run.id)
        return _Place(run, prefix, rel)

    async def upload(self, principal: Principal, path: str, chunks: AsyncIterator[bytes]) -> int:
        place = await run_in_threadpool(self._place, principal, path, write=True)
        if not place.rel:
            raise InvalidInput("name the artifact's file: <experiment id>/<run id>/artifacts/<path>")
        if place.run.job_id:  # the job's outputs, from the job itself while it runs (its token)
            stored = await self.outputs.upload_file(principal, place.run.job_id, "artifact", place.rel, chunks)
            return stored.size
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="run-artifact-")
        tmp = Path(name)
        try:
            size, next_check = 0, QUOTA_CHECK_BYTES
            with os.fdopen(fd, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    fh.write(chunk)
                    if size >= next_check:  # over the storage quota: stop reading now, not at the end
                        await run_in_threadpool(self._check_quota, principal, size)
                        next_check += QUOTA_CHECK_BYTES
            await run_in_threadpool(self._store, principal, place, tmp, size)
        finally:
            tmp.unlink(missing_ok=True)
        return size

    def _check_quota(self, principal: Principal, size: int) -> None:
        with self.quotas.db.transaction() as s:
            self.quotas.check_storage(s, principal.org_id, principal.org_name, size)

    def _store(self, principal: Principal, place: _Place, tmp: Path, size: int) -> None:
        key = f"{place.prefix}/{place.rel}"
        replaced = sum(size for _, size in self.store.list(key)) if one_file(self.store.list(key)) else 0
        self._check_quota(principal, size - replaced)
        self.store.put_file(tmp, key)
        with self.tracking.db.transaction() as s:
            s.execute(
                update(Run).where(Run.id == place.run.id).values(artifact_bytes=Run.artifact_bytes + size - replaced)
            )

    def listing(self, principal: Principal, path: str) -> list[ArtifactEntry]:
        """The files and directories right under ``path`` (nothing for a file, as MLflow's server answers)."""
        place = self._place(principal, path)
        return entries_under(self.store, f"{place.prefix}/{place.rel}".rstrip("/"))

    def read(self, principal: Principal, path: str) -> Iterator[bytes]:
        place = self._place(principal, path)
        key = f"{place.prefix}/{place.rel}"
        if not place.rel or not one_file(self.store.list(key)):
            raise NotFound(f"run {place.run.id} has no artifact file {place.rel!r}")
        return self.store.iter_bytes(key)


def one_file(listed: list[tuple[str, int]]) -> bool:
    """Whether a store listing of a key is that key itself: a file, not a directory."""
    return len(listed) == 1 and listed[0][0] in ("", ".")


def entries_under(store: ObjectStore, base: str) -> list[ArtifactEntry]:
    """The files and directories right under the store key ``base`` (nothing for a file, as MLflow's server
    answers)."""
    found = store.list(base)
    if one_file(found):
        return []  # a file: what lies under it is nothing
    entries: dict[str, ArtifactEntry] = {}
    for rel, size in found:
        head, sep, _ = rel.partition("/")
        entries[head] = ArtifactEntry(head, True, None) if sep else ArtifactEntry(head, False, size)
    return sorted(entries.values(), key=lambda e: e.path)
