"""Versioned datasets: per-organisation names with immutable numbered versions, each a manifest of files whose
bytes are stored content-addressed (``orgs/<org>/data/sha256/<aa>/<sha256>``), so no blob is stored twice.

Upload protocol (see docs/storage.md):

1. ``create_draft``: the client sends the manifest (path, size, sha256 of every file); the server validates every
   path, records an invisible draft and answers which blobs it lacks. The same manifest again returns the same
   draft (or, when it is already the latest version, that version: nothing to do).
2. ``open_upload`` per missing blob: one session per (organisation, sha256); asking again returns the same session
   and the parts already received, so an interrupted upload resumes. The blob's size counts against the storage
   quota from here on (403 with the numbers when it does not fit; nothing is written).
3. Parts: through the API (``put_part``: the part's SHA-256 is checked) or, on S3, straight to the store through
   a presigned URL (``part_url``, or ``part_urls`` for many parts in one request: the store refuses a body whose
   Content-MD5 differs; the server checks the stored part's ETag against the declared MD5 again at completion).
   A new presigned session takes the client's preferred part size when S3's limits allow it.
4. ``complete_upload``: every part present and verified → the store assembles the object (on a local store the
   server also re-hashes the whole file) and the blob is recorded.
5. ``commit``: every blob present → the draft becomes the next version, atomically.

Removing a version deletes the blobs no other version of the organisation references; it is refused (409) while a
job that has not ended pins the version in its ``inputs``.

This module holds the datasets and their versions (steps 1 and 5, reads, removal); the upload sessions of steps 2
to 4 are ``kiln.usecases.data.uploads``, and the rules for names, paths, manifests and store keys
``kiln.usecases.data.dataset_names``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln.db.tables import DataBlob, Dataset, DatasetVersion, ModelFile, utcnow
from kiln.db.tables import (
    DatasetFile as FileRow,
)
from kiln.domain.datasets import (
    DatasetFileEntry,
    DatasetManifest,
    DatasetRemoved,
    DatasetSummary,
    DatasetVersionRead,
    DraftCreate,
    DraftRead,
)
from kiln.domain.ids import new_id
from kiln.errors import Conflict, NotFound
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import lock_org
from kiln.usecases.data.dataset_names import (
    data_key,
    manifest_sha256,
    parse_ref,
    validate_manifest,
    validate_name,
    validate_path,
)
from kiln.usecases.data.input_access import pinning_job, require_input_read
from kiln.usecases.data.uploads import UploadService

log = logging.getLogger(__name__)

DRAFT_TTL = timedelta(days=7)
_CHUNK = 500  # ids per IN (...) list


@dataclass(frozen=True)
class DatasetFile:
    """One file of a resolved version; ``key`` is the ObjectStore key of its blob (``ObjectStore.download``)."""

    path: str
    size: int
    sha256: str
    key: str


@dataclass(frozen=True)
class ResolvedDataset:
    name: str
    version: int
    files: list[DatasetFile]


def describe_versions(numbers: list[int], most: int = 10) -> str:
    """Version numbers for people: ``1, 2, 3``; runs of four or more as ``1-12``; past ``most`` pieces the first
    and last few, ``1-40, 42, …, 97, 99``."""
    pieces: list[str] = []
    start = 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            run = numbers[start:i]
            pieces += [f"{run[0]}-{run[-1]}"] if len(run) >= 4 else [str(n) for n in run]
            start = i
    if len(pieces) > most:
        pieces = [*pieces[: most // 2], "…", *pieces[-(most // 2) :]]
    return ", ".join(pieces)


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _present(s: Session, org_id: str, shas: Iterable[str]) -> set[str]:
    wanted = sorted(set(shas))
    out: set[str] = set()
    for chunk in _chunks(wanted):
        out.update(s.scalars(select(DataBlob.sha256).where(DataBlob.org_id == org_id, DataBlob.sha256.in_(chunk))))
    return out


class DatasetService(UploadService):
    """The organisation's datasets and their versions: reads, drafts, commits and removal (the upload sessions of
    their blobs come from ``UploadService``)."""

    # -- lookups ------------------------------------------------------------------------------------------------

    @staticmethod
    def _dataset(s: Session, org_id: str, name: str) -> Dataset:
        ds = s.scalar(select(Dataset).where(Dataset.org_id == org_id, Dataset.name == name))
        if ds is None:
            raise NotFound(f"dataset {name!r} not found")
        return ds

    @staticmethod
    def _version(s: Session, ds: Dataset, version: int | None) -> DatasetVersion:
        query = select(DatasetVersion).where(DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready")
        if version is None:
            row = s.scalar(query.order_by(DatasetVersion.version.desc()).limit(1))
        else:
            row = s.scalar(query.where(DatasetVersion.version == version))
        if row is None:
            raise DatasetService._no_version(s, ds, version)
        return row

    @staticmethod
    def _no_version(s: Session, ds: Dataset, version: int | None) -> NotFound:
        """The dataset exists but not this version: which ones it has (``details``: the dataset, the version asked
        for and the latest, for programs)."""
        numbers = [
            n
            for n in s.scalars(
                select(DatasetVersion.version)
                .where(DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready")
                .order_by(DatasetVersion.version)
            )
            if n is not None
        ]
        latest = numbers[-1] if numbers else None
        details = {"dataset": ds.name, "version": version, "latest": latest}
        if not numbers:
            return NotFound(f"dataset {ds.name} has no version yet (none has been committed)", details=details)
        return NotFound(
            f"dataset {ds.name} has no version {version}; it has {describe_versions(numbers)} (latest {latest})",
            details=details,
        )

    @staticmethod
    def _version_read(name: str, v: DatasetVersion) -> DatasetVersionRead:
        return DatasetVersionRead(
            name=name,
            version=v.version or 0,
            files=v.file_count,
            size=v.size,
            manifest_sha256=v.manifest_sha256,
            created_at=v.committed_at or v.created_at,
        )

    # -- reads --------------------------------------------------------------------------------------------------

    def list_datasets(self, principal: Principal) -> list[DatasetSummary]:
        principal.require("blobs:read")
        with self.db.read() as s:
            rows = s.execute(
                select(Dataset, DatasetVersion)
                .join(DatasetVersion, DatasetVersion.dataset_id == Dataset.id)
                .where(Dataset.org_id == principal.org_id, DatasetVersion.state == "ready")
                .order_by(Dataset.name, DatasetVersion.version)
            ).all()
        out: dict[str, DatasetSummary] = {}
        for ds, v in rows:
            prev = out.get(ds.name)
            out[ds.name] = DatasetSummary(
                name=ds.name,
                latest_version=v.version or 0,
                versions=(prev.versions if prev else 0) + 1,
                files=v.file_count,
                size=v.size,
                updated_at=ds.updated_at,
            )
        return list(out.values())

    def versions(self, principal: Principal, name: str) -> list[DatasetVersionRead]:
        principal.require("blobs:read")
        validate_name(name)
        with self.db.read() as s:
            ds = self._dataset(s, principal.org_id, name)
            rows = s.scalars(
                select(DatasetVersion)
                .where(DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready")
                .order_by(DatasetVersion.version)
            ).all()
            if not rows:
                raise self._no_version(s, ds, None)
            return [self._version_read(name, v) for v in rows]

    def manifest(self, principal: Principal, name: str, version: int | None) -> DatasetManifest:
        if principal.job_id is None:
            principal.require("blobs:read")
        validate_name(name)
        with self.db.read() as s:
            ds = self._dataset(s, principal.org_id, name)
            v = self._version(s, ds, version)
            require_input_read(s, principal, "blobs:read", "dataset", name, v.version)
            files = s.scalars(select(FileRow).where(FileRow.version_id == v.id).order_by(FileRow.path)).all()
            head = self._version_read(name, v)
            # Built from stored rows, not validated again: a version stored before a bound was tightened stays
            # readable (and a manifest of many files is not validated file by file).
            items = [DatasetFileEntry.model_construct(path=f.path, size=f.size, sha256=f.sha256) for f in files]
        return DatasetManifest(**head.model_dump(), items=items)

    def file(self, principal: Principal, name: str, version: int, path: str) -> tuple[str, DatasetFileEntry]:
        """(store key, entry) of one file of a ready version."""
        if principal.job_id is None:
            principal.require("blobs:read")
        validate_name(name)
        validate_path(path)
        with self.db.read() as s:
            ds = self._dataset(s, principal.org_id, name)
            v = self._version(s, ds, version)
            require_input_read(s, principal, "blobs:read", "dataset", name, v.version)
            row = s.get(FileRow, (v.id, path))
            if row is None:
                raise NotFound(f"dataset {name}@{version} has no file {path!r}")
            return data_key(principal.org_id, row.sha256), DatasetFileEntry.model_construct(
                path=row.path, size=row.size, sha256=row.sha256
            )

    def presigned_get(self, key: str, path: str) -> str | None:
        """A short-lived URL reading the blob straight from the store, when the store gives one."""
        if not self.presigned:
            return None
        return self.store.presign_get(key, self.settings.storage_presign_seconds, path.rsplit("/", 1)[-1])

    def resolve(self, org_id: str, ref: str) -> ResolvedDataset:
        """``NAME`` (the latest ready version) or ``NAME@VERSION`` of organisation ``org_id`` → its files.
        For the executor (same process as the server); raises NotFound when there is no such ready version."""
        name, version = parse_ref(ref)
        with self.db.read() as s:
            ds = self._dataset(s, org_id, name)
            v = self._version(s, ds, version)
            rows = s.scalars(select(FileRow).where(FileRow.version_id == v.id).order_by(FileRow.path)).all()
            files = [DatasetFile(r.path, r.size, r.sha256, data_key(org_id, r.sha256)) for r in rows]
            return ResolvedDataset(name=name, version=v.version or 0, files=files)

    # -- drafts and commits -------------------------------------------------------------------------------------

    def create_draft(self, principal: Principal, body: DraftCreate) -> DraftRead:
        principal.require("blobs:write")
        name = validate_name(body.name)
        files = validate_manifest(body.files, self.settings.dataset_max_files)
        digest = manifest_sha256(files)
        total = sum(f.size for f in files)
        for attempt in range(2):
            try:
                with self.db.transaction() as s:
                    draft, version = self._draft(s, principal.org_id, name, files, digest, total)
                    missing = (
                        []
                        if version
                        else sorted(
                            {f.sha256 for f in files} - _present(s, principal.org_id, [f.sha256 for f in files])
                        )
                    )
                break
            except IntegrityError:  # a concurrent first draft of the same name
                if attempt:
                    raise
        sizes = {f.sha256: f.size for f in files}
        return DraftRead(
            id=draft,
            name=name,
            manifest_sha256=digest,
            files=len(files),
            size=total,
            missing=missing,
            missing_bytes=sum(sizes[m] for m in missing),
            version=version,
        )

    def _draft(
        self, s: Session, org_id: str, name: str, files: list[DatasetFileEntry], digest: str, total: int
    ) -> tuple[str, int | None]:
        ds = s.scalar(select(Dataset).where(Dataset.org_id == org_id, Dataset.name == name))
        if ds is None:
            ds = Dataset(id=new_id("ds"), org_id=org_id, name=name)
            s.add(ds)
            s.flush()
        latest = s.scalar(
            select(DatasetVersion)
            .where(DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready")
            .order_by(DatasetVersion.version.desc())
            .limit(1)
        )
        if latest is not None and latest.manifest_sha256 == digest:
            return latest.id, latest.version
        # Drafts nobody committed for a week go (their blobs stay until a sweep of unreferenced data).
        s.execute(
            delete(DatasetVersion).where(
                DatasetVersion.dataset_id == ds.id,
                DatasetVersion.state == "draft",
                DatasetVersion.created_at < utcnow() - DRAFT_TTL,
            )
        )
        same = s.scalar(
            select(DatasetVersion).where(
                DatasetVersion.dataset_id == ds.id,
                DatasetVersion.state == "draft",
                DatasetVersion.manifest_sha256 == digest,
            )
        )
        if same is not None:
            return same.id, None
        draft = DatasetVersion(
            id=new_id("dsv"), dataset_id=ds.id, state="draft", manifest_sha256=digest, file_count=len(files), size=total
        )
        s.add(draft)
        s.flush()
        s.bulk_insert_mappings(  # type: ignore[arg-type]
            FileRow,
            [
                {"version_id": draft.id, "path": f.path, "org_id": org_id, "size": f.size, "sha256": f.sha256}
                for f in files
            ],
        )
        return draft.id, None

    def commit(self, principal: Principal, draft_id: str) -> DatasetVersionRead:
        """Make the draft the next version once every blob it names is stored (409 with the missing ones)."""
        principal.require("blobs:write")
        with self.db.transaction() as s:
            lock_org(s, principal.org_id)
            row = s.execute(
                select(DatasetVersion, Dataset)
                .join(Dataset, Dataset.id == DatasetVersion.dataset_id)
                .where(DatasetVersion.id == draft_id, Dataset.org_id == principal.org_id)
            ).first()
            if row is None:
                raise NotFound(f"draft {draft_id} not found")
            draft, ds = row
            if draft.state == "ready":
                return self._version_read(ds.name, draft)
            shas = list(s.scalars(select(FileRow.sha256).where(FileRow.version_id == draft.id)))
            missing = sorted(set(shas) - _present(s, principal.org_id, shas))
            if missing:
                raise Conflict(
                    f"draft {draft_id}: {len(missing)} blob(s) are not uploaded yet (first: {missing[0]})",
                    details={"missing": missing[:100]},
                )
            top = s.scalar(select(func.max(DatasetVersion.version)).where(DatasetVersion.dataset_id == ds.id))
            draft.version = (top or 0) + 1
            draft.state = "ready"
            draft.committed_at = utcnow()
            ds.updated_at = draft.committed_at
            s.flush()
            return self._version_read(ds.name, draft)

    # -- removal ------------------------------------------------------------------------------------------------

    def remove(self, principal: Principal, name: str, version: int | None) -> DatasetRemoved:
        """Remove one version (``version``) or the whole dataset, and the blobs nothing else references."""
        principal.require("blobs:write")
        validate_name(name)
        org = principal.org_id
        with self.db.transaction() as s:
            lock_org(s, org)
            ds = self._dataset(s, org, name)
            ready = list(
                s.scalars(
                    select(DatasetVersion)
                    .where(DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready")
                    .order_by(DatasetVersion.version)
                )
            )
            if version is not None:
                doomed = [v for v in ready if v.version == version]
                if not doomed:
                    raise self._no_version(s, ds, version)
            else:
                if not ready:
                    raise self._no_version(s, ds, None)
                doomed = list(s.scalars(select(DatasetVersion).where(DatasetVersion.dataset_id == ds.id)))
            numbers = sorted(v.version for v in doomed if v.version is not None)
            latest = ready[-1].version if ready else None
            self._refuse_pinned(s, org, name, set(numbers), latest)
            ids = [v.id for v in doomed]
            shas: set[str] = set()
            for chunk in _chunks(ids):
                shas.update(s.scalars(select(FileRow.sha256).where(FileRow.version_id.in_(chunk))))
                s.execute(delete(FileRow).where(FileRow.version_id.in_(chunk)))
                s.execute(delete(DatasetVersion).where(DatasetVersion.id.in_(chunk)))
            if version is None or (len(doomed) == len(ready) and not self._has_drafts(s, ds.id)):
                s.execute(delete(Dataset).where(Dataset.id == ds.id))
            else:
                ds.updated_at = utcnow()
            still: set[str] = set()
            for chunk in _chunks(sorted(shas)):
                still.update(s.scalars(select(FileRow.sha256).where(FileRow.org_id == org, FileRow.sha256.in_(chunk))))
                # A registered model's files live in the same blobs (kiln.usecases.models.model_registry): theirs stay
                # too.
                still.update(
                    s.scalars(select(ModelFile.sha256).where(ModelFile.org_id == org, ModelFile.sha256.in_(chunk)))
                )
            orphans = sorted(shas - still)
            freed = 0
            for chunk in _chunks(orphans):
                freed += int(
                    s.scalar(
                        select(func.coalesce(func.sum(DataBlob.size), 0)).where(
                            DataBlob.org_id == org, DataBlob.sha256.in_(chunk)
                        )
                    )
                    or 0
                )
                s.execute(delete(DataBlob).where(DataBlob.org_id == org, DataBlob.sha256.in_(chunk)))
        # The rows are gone (the version is removed whatever happens next); the bytes follow, best effort: an
        # object left behind by a failing store is unreferenced and no longer counted against the quota.
        for sha in orphans:
            try:
                self.store.delete(data_key(org, sha))
            except Exception as exc:
                log.warning("dataset %s: could not delete blob %s: %s", name, sha, exc)
        return DatasetRemoved(name=name, versions=numbers, blobs_deleted=len(orphans), bytes_freed=freed)

    @staticmethod
    def _has_drafts(s: Session, dataset_id: str) -> bool:
        return (
            s.scalar(
                select(func.count())
                .select_from(DatasetVersion)
                .where(DatasetVersion.dataset_id == dataset_id, DatasetVersion.state == "draft")
            )
            or 0
        ) > 0

    @staticmethod
    def _refuse_pinned(s: Session, org_id: str, name: str, numbers: set[int], latest: int | None) -> None:
        """409 while a job that has not ended reads one of these versions (``spec.inputs``: NAME@V, or NAME for
        the latest one)."""
        found = pinning_job(s, org_id, "dataset", name, numbers, latest)
        if found is not None:
            job_id, state, pinned = found
            raise Conflict(
                f"dataset {name}@{pinned} is an input of job {job_id} ({state}); remove it once the job "
                "has ended (or cancel the job)"
            )
