"""What a new model version is made of: the files of a finished job's outputs, copied into the organisation's
content-addressed data blobs (``orgs/<org>/data/sha256/..``, the ``data_blobs`` rows datasets use, so bytes already
held, by a dataset or another version, are not stored again), and the job's lineage.

Used by ``kiln.usecases.models.model_registry.ModelRegistry.register``; the store I/O happens here, outside any
transaction, and the registry records the version under the organisation's lock afterwards.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.tables import DataBlob, Job, MetricSeries, ModelFile, ModelVersion, TuningTrial
from kiln.domain.models import ModelLineage
from kiln.errors import BadRequest, KilnError, NotFound
from kiln.storage.keys import outputs_prefix
from kiln.storage.store import ObjectStore
from kiln.usecases.data.dataset_names import data_key

log = logging.getLogger(__name__)

MAX_METRICS = 200  # names kept in a version's lineage
_CHUNK = 500
_READ = 4 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    """One file of a new version: its path in the version, its store key, and (once read) its content hash.
    ``uploaded``: the server stored it from an upload (a logged model's file), never a job's own output file."""

    path: str
    key: str
    size: int
    sha256: str = ""
    uploaded: bool = False


def held(s: Session, org_id: str, shas: Iterable[str]) -> set[str]:
    """The content hashes the organisation's data blobs already hold."""
    wanted = sorted(set(shas))
    out: set[str] = set()
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        out.update(s.scalars(select(DataBlob.sha256).where(DataBlob.org_id == org_id, DataBlob.sha256.in_(chunk))))
    return out


def identical_version(
    s: Session, model_id: str, origin: ModelLineage, framework: str, files: list[SourceFile]
) -> ModelVersion | None:
    """The model's version registered from the same job (or run) with the same framework and exactly these files
    (paths and contents): registering it again would make an identical version, which is nearly always a mistake."""
    wanted = {(f.path, f.sha256) for f in files}
    candidates = s.scalars(
        select(ModelVersion)
        .where(
            ModelVersion.model_id == model_id,
            ModelVersion.job_id == origin.job_id,
            ModelVersion.run_id.is_(None) if origin.run_id is None else ModelVersion.run_id == origin.run_id,
            ModelVersion.framework == framework,
            ModelVersion.file_count == len(files),
        )
        .order_by(ModelVersion.version)
    ).all()
    for version in candidates:
        held_files = s.execute(select(ModelFile.path, ModelFile.sha256).where(ModelFile.version_id == version.id))
        if {(path, sha) for path, sha in held_files} == wanted:
            return version
    return None


def pick_outputs(store: ObjectStore, job: Job, path: str, max_files: int) -> list[SourceFile]:
    """The job's output at ``path``: that file (named by its base name in the version), or every file under that
    directory (named relative to it). NotFound saying what the job has when there is neither."""
    prefix = outputs_prefix(job.org_id, job.id)
    outputs = store.list(prefix)
    exact = [(p, n) for p, n in outputs if p == path]
    if exact:
        return [SourceFile(path.rsplit("/", 1)[-1], f"{prefix}/{path}", exact[0][1])]
    below = [(p[len(path) + 1 :], p, n) for p, n in outputs if p.startswith(path + "/")]
    if not below:
        names = ", ".join(p for p, _ in outputs[:10]) + (", …" if len(outputs) > 10 else "")
        has = f"its outputs are: {names}" if outputs else "it has no outputs"
        raise NotFound(f"job {job.id} has no output file or directory {path!r} ({has})", details={"field": "path"})
    if len(below) > max_files:
        raise BadRequest(
            f"path: {path!r} holds {len(below)} files; a model version holds at most {max_files}",
            details={"field": "path"},
        )
    return [SourceFile(rel, f"{prefix}/{full}", size) for rel, full, size in below]


class BlobCopier:
    """Hashes job output files and copies the ones the organisation lacks into its data blobs. ``copied`` keeps
    what this copier wrote, so that a failure can delete what no record holds (``forget``)."""

    def __init__(self, store: ObjectStore, tmp_dir: Path, org_id: str) -> None:
        self.store = store
        self.tmp_dir = tmp_dir
        self.org_id = org_id
        self.copied: dict[str, int] = {}

    def hashed(self, files: list[SourceFile]) -> list[SourceFile]:
        """Each file with its SHA-256, read from the store (in place on a local store) unless it came with one."""
        out = []
        for f in files:
            if f.sha256:
                out.append(f)
                continue
            with self._local(f.key) as local:
                digest = hashlib.sha256()
                size = 0
                with local.open("rb") as fh:
                    while data := fh.read(_READ):
                        digest.update(data)
                        size += len(data)
            out.append(SourceFile(f.path, f.key, size, digest.hexdigest(), f.uploaded))
        return out

    def copy(self, files: list[SourceFile], skip: set[str]) -> None:
        """Store each distinct content not in ``skip`` (already held) nor copied yet."""
        for f in files:
            if f.sha256 in skip or f.sha256 in self.copied:
                continue
            if f.uploaded:  # the server's own file: the blob may share its bytes (a link on a local store)
                self.store.copy(f.key, data_key(self.org_id, f.sha256))
            else:  # a job's output: the blob is a file of the server's, never one a job wrote (or may write)
                with self._local(f.key) as local:
                    self.store.put_file(local, data_key(self.org_id, f.sha256))
            self.copied[f.sha256] = f.size

    def forget(self, s: Session) -> None:
        """Delete what this copier stored that no data blob record holds (after a failure; best effort)."""
        keep = held(s, self.org_id, self.copied)
        for sha in self.copied:
            if sha not in keep:
                try:
                    self.store.delete(data_key(self.org_id, sha))
                except KilnError as exc:
                    log.warning("could not delete the unrecorded blob %s: %s", sha, exc.message)
        self.copied.clear()

    def _local(self, key: str) -> _LocalCopy:
        return _LocalCopy(self.store, self.tmp_dir, key)


class _LocalCopy:
    """A local path with the object's bytes: the object itself on a local store, else a temporary download."""

    def __init__(self, store: ObjectStore, tmp_dir: Path, key: str) -> None:
        self.store = store
        self.tmp_dir = tmp_dir
        self.key = key
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        local = self.store.local_path(self.key)
        if local is not None:
            if not local.is_file():
                raise NotFound(f"output {self.key.rsplit('/outputs/', 1)[-1]!r} is no longer in the store")
            return local
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="model-")
        os.close(fd)
        self.tmp = Path(name)
        self.store.download(self.key, self.tmp)
        return self.tmp

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def lineage(s: Session, job: Job) -> ModelLineage:
    """The job, its spec, the last value of each of its scalar metrics (a member's own, worker 0's first; the
    system's samples aside) and the study and trial it ran for."""
    metrics: dict[str, float] = {}
    rows = s.execute(
        select(MetricSeries.name, MetricSeries.last_value)
        .where(MetricSeries.job_id == job.id, MetricSeries.kind == "scalar", MetricSeries.source != "sys")
        .order_by(MetricSeries.worker, MetricSeries.name)
    )
    for name, value in rows:
        if value is not None and math.isfinite(value) and len(metrics) < MAX_METRICS:
            metrics.setdefault(name, float(value))
    trial = s.execute(select(TuningTrial.study_id, TuningTrial.number).where(TuningTrial.job_id == job.id)).first()
    return ModelLineage(
        job_id=job.id,
        job_name=job.name,
        job_state=job.state,
        spec=dict(job.spec),
        metrics=dict(sorted(metrics.items())),
        study_id=trial[0] if trial else None,
        trial=trial[1] if trial else None,
    )
