"""An ended job's outputs as another job's input (``inputs: [{job: ID}]``): checked and read once, at the first
submit that names them (the job must be the organisation's and have succeeded), each file's path, size and
SHA-256 kept in ``output_manifests``. Outputs are final once a job has ended, so the manifest never changes; the
reading job's attempts stage the files straight from the first job's outputs, checking each hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from kiln.backends.base import InputFile, ResolvedInput
from kiln.db.session import Database
from kiln.db.tables import Job, OutputManifest
from kiln.domain.spec import InputSpec
from kiln.domain.states import JobState
from kiln.errors import InvalidInput, NotFound
from kiln.storage.keys import outputs_prefix
from kiln.storage.store import ObjectStore
from kiln.usecases.models.model_sources import BlobCopier, SourceFile

MAX_FILES = 10_000


@dataclass(frozen=True)
class Manifest:
    job_id: str
    files: tuple[tuple[str, int, str], ...]  # (path, size, sha256), sorted by path
    digest: str

    def resolved(self, org_id: str, item: InputSpec) -> ResolvedInput:
        prefix = outputs_prefix(org_id, self.job_id)
        return ResolvedInput(
            name=item.label,
            version=0,
            path=item.where,
            env=item.env,
            mode="stage",
            files=tuple(InputFile(path, size, sha, f"{prefix}/{path}") for path, size, sha in self.files),
        )


def manifest_digest(files: list[tuple[str, int, str]]) -> str:
    """What the outputs are, in one hash: the sorted (path, SHA-256) pairs."""
    digest = hashlib.sha256()
    for path, _, sha in sorted(files):
        digest.update(f"{path}\0{sha}\n".encode())
    return digest.hexdigest()


class OutputManifests:
    def __init__(self, db: Database, store: ObjectStore, tmp_dir: Path) -> None:
        self.db = db
        self.store = store
        self.tmp_dir = tmp_dir

    def pin(self, org_id: str, job_id: str, field: str = "job") -> Manifest:
        """The outputs of the organisation's job ``job_id``, which must have succeeded; read and kept on first
        use. InvalidInput naming ``field`` otherwise."""
        with self.db.read() as s:
            job = s.scalar(select(Job).where(Job.id == job_id, Job.org_id == org_id))
            kept = s.get(OutputManifest, job_id) if job is not None else None
        if job is None:
            raise InvalidInput(f"{field}: no job {job_id} in this organisation", details={"field": field})
        if job.state != JobState.SUCCEEDED:
            raise InvalidInput(
                f"{field}: job {job_id} is {job.state}; its outputs are an input once it has succeeded",
                details={"field": field},
            )
        if kept is not None:
            return _manifest(kept)
        prefix = outputs_prefix(org_id, job_id)
        listed = self.store.list(prefix)
        if len(listed) > MAX_FILES:
            raise InvalidInput(
                f"{field}: job {job_id} has {len(listed)} output files; an input holds at most {MAX_FILES}",
                details={"field": field},
            )
        hashed = BlobCopier(self.store, self.tmp_dir, org_id).hashed(
            [SourceFile(path, f"{prefix}/{path}", size) for path, size in listed]
        )
        files = sorted((f.path, f.size, f.sha256) for f in hashed)
        row = OutputManifest(
            job_id=job_id,
            org_id=org_id,
            files=[list(f) for f in files],
            digest=manifest_digest(files),
            bytes=sum(size for _, size, _ in files),
        )
        try:
            with self.db.transaction() as s:
                s.add(row)
        except IntegrityError:  # another submit read them first: the same files, kept once
            pass
        return Manifest(job_id, tuple(files), row.digest)

    def get(self, org_id: str, job_id: str) -> Manifest:
        """The kept manifest (pinned at submit); NotFound when the job or its manifest is gone."""
        with self.db.read() as s:
            row = s.scalar(
                select(OutputManifest).where(OutputManifest.job_id == job_id, OutputManifest.org_id == org_id)
            )
            if row is None:
                raise NotFound(f"input job {job_id}: its outputs are gone (the job was deleted)")
            return _manifest(row)


def _manifest(row: OutputManifest) -> Manifest:
    files = tuple((str(p), int(n), str(h)) for p, n, h in row.files)
    return Manifest(row.job_id, files, row.digest)
