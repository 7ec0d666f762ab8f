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
"""

from __future__ import annotations

import hashlib
import logging
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln.db.models import (
    DataBlob,
    Dataset,
    DatasetVersion,
    DataUpload,
    DataUploadPart,
    Job,
    Organization,
    utcnow,
)
from kiln.db.models import (
    DatasetFile as FileRow,
)
from kiln.db.session import Database
from kiln.domain.ids import new_id
from kiln.domain.schemas import (
    DatasetFileEntry,
    DatasetManifest,
    DatasetRemoved,
    DatasetSummary,
    DatasetVersionRead,
    DraftCreate,
    DraftRead,
    NumberedPartUrl,
    PartRead,
    PartUrl,
    PartUrlRequest,
    PartUrls,
    PartUrlsRequest,
    UploadRead,
)
from kiln.domain.states import JobState
from kiln.errors import BadRequest, Conflict, DigestMismatch, Forbidden, NotFound
from kiln.services.identity import Principal
from kiln.services.quotas import QuotaService
from kiln.settings import Settings
from kiln.storage.store import ObjectStore, b64_digest

log = logging.getLogger(__name__)

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
PERCENT_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHA256 = re.compile(r"[0-9a-f]{64}")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Parts sent through the API travel in one signed request body, which the API caps at 16 MiB.
API_PART_BYTES = 16 * 1024 * 1024
# S3's multipart limits: parts of 5 MiB to 5 GiB (the last may be shorter), at most 10,000 of them.
S3_MIN_PART = 5 * 1024 * 1024
S3_MAX_PART = 5 * 1024**3
S3_MAX_PARTS = 10_000
MAX_PATH = 1024
DRAFT_TTL = timedelta(days=7)
PINNING_STATES = [s.value for s in JobState if not s.terminal]
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


# -- validation -------------------------------------------------------------------------------------------------


def validate_name(name: str) -> str:
    """A dataset name: lowercase letters, digits and ``- _ .``, at most 100, no ``..``, nothing percent-encoded."""
    if PERCENT_ENCODED.search(name) or "%" in name:
        raise BadRequest(f"dataset name {name!r}: percent-encoded characters are not allowed")
    if "/" in name or "\\" in name or "\x00" in name:
        raise BadRequest(f"dataset name {name!r}: '/', '\\' and NUL are not allowed")
    if ".." in name:
        raise BadRequest(f"dataset name {name!r}: '..' is not allowed")
    if not NAME.fullmatch(name):
        raise BadRequest(
            f"dataset name {name!r}: use lowercase letters, digits and . _ - (at most 100, starting with a letter "
            "or digit)"
        )
    return name


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME@VERSION`` → (name, version or None)."""
    name, at, version = ref.partition("@")
    validate_name(name)
    if not at:
        return name, None
    if not version.isdigit() or int(version) < 1 or len(version) > 9:
        raise BadRequest(f"dataset reference {ref!r}: the version after @ is a number ≥ 1")
    return name, int(version)


def validate_path(path: str) -> str:
    """A file path inside a dataset: relative, ``/``-separated, no ``.``/``..``/empty segments, no backslash, NUL,
    control characters or percent-encoding. The error names the offending part."""
    if not path:
        raise BadRequest("file path: empty")
    if len(path) > MAX_PATH:
        raise BadRequest(f"file path {path[:60]!r}...: longer than {MAX_PATH} characters")
    if "\x00" in path:
        raise BadRequest(f"file path {path!r}: NUL is not allowed")
    if "\\" in path:
        raise BadRequest(f"file path {path!r}: backslashes are not allowed (use '/')")
    if CONTROL.search(path):
        raise BadRequest(f"file path {path!r}: control characters are not allowed")
    if match := PERCENT_ENCODED.search(path):
        raise BadRequest(f"file path {path!r}: percent-encoded {match.group(0)!r} is not allowed")
    if path.startswith("/"):
        raise BadRequest(f"file path {path!r}: absolute paths are not allowed")
    for index, segment in enumerate(path.split("/"), start=1):
        if segment in (".", ".."):
            raise BadRequest(f"file path {path!r}: segment {index} is {segment!r}, which is not allowed")
        if segment == "":
            raise BadRequest(f"file path {path!r}: segment {index} is empty")
    return path


def validate_manifest(files: list[DatasetFileEntry], max_files: int) -> list[DatasetFileEntry]:
    if not files:
        raise BadRequest("a dataset version needs at least one file")
    if len(files) > max_files:
        raise BadRequest(f"{len(files)} files: a dataset version holds at most {max_files}")
    seen: set[str] = set()
    for entry in files:
        validate_path(entry.path)
        if entry.path in seen:
            raise BadRequest(f"file path {entry.path!r}: listed twice")
        seen.add(entry.path)
    dirs = {p.rsplit("/", 1)[0] for p in seen if "/" in p}
    expanded: set[str] = set()
    for d in dirs:
        parts = d.split("/")
        expanded.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    clash = sorted(seen & expanded)
    if clash:
        raise BadRequest(f"file path {clash[0]!r}: is both a file and a directory")
    return sorted(files, key=lambda f: f.path)


def manifest_sha256(files: list[DatasetFileEntry]) -> str:
    text = "".join(f"{f.path}\t{f.size}\t{f.sha256}\n" for f in sorted(files, key=lambda f: f.path))
    return hashlib.sha256(text.encode()).hexdigest()


def data_key(org_id: str, sha256: str) -> str:
    if not SHA256.fullmatch(sha256):
        raise BadRequest(f"invalid sha256 {sha256!r}")
    return f"orgs/{org_id}/data/sha256/{sha256[:2]}/{sha256}"


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _present(s: Session, org_id: str, shas: Iterable[str]) -> set[str]:
    wanted = sorted(set(shas))
    out: set[str] = set()
    for chunk in _chunks(wanted):
        out.update(s.scalars(select(DataBlob.sha256).where(DataBlob.org_id == org_id, DataBlob.sha256.in_(chunk))))
    return out


def _lock_org(s: Session, org_id: str) -> None:
    """Serialise the organisation's dataset writes (SQLite's BEGIN IMMEDIATE already does)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(select(Organization.id).where(Organization.id == org_id).with_for_update())


class DatasetService:
    def __init__(self, db: Database, store: ObjectStore, settings: Settings, quotas: QuotaService | None) -> None:
        self.db = db
        self.store = store
        self.settings = settings
        self.quotas = quotas
        self.presigned = store.is_s3 and settings.storage_presign
        self.part_size = settings.dataset_part_bytes if self.presigned else API_PART_BYTES
        self.tmp_dir = settings.home / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

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
            what = f"{ds.name}@{version}" if version is not None else f"{ds.name} (no version yet)"
            raise NotFound(f"dataset {what} not found")
        return row

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
                raise NotFound(f"dataset {name!r} not found")
            return [self._version_read(name, v) for v in rows]

    def manifest(self, principal: Principal, name: str, version: int | None) -> DatasetManifest:
        principal.require("blobs:read")
        validate_name(name)
        with self.db.read() as s:
            ds = self._dataset(s, principal.org_id, name)
            v = self._version(s, ds, version)
            files = s.scalars(select(FileRow).where(FileRow.version_id == v.id).order_by(FileRow.path)).all()
            head = self._version_read(name, v)
            items = [DatasetFileEntry(path=f.path, size=f.size, sha256=f.sha256) for f in files]
        return DatasetManifest(**head.model_dump(), items=items)

    def file(self, principal: Principal, name: str, version: int, path: str) -> tuple[str, DatasetFileEntry]:
        """(store key, entry) of one file of a ready version."""
        principal.require("blobs:read")
        validate_name(name)
        validate_path(path)
        with self.db.read() as s:
            ds = self._dataset(s, principal.org_id, name)
            v = self._version(s, ds, version)
            row = s.get(FileRow, (v.id, path))
            if row is None:
                raise NotFound(f"dataset {name}@{version} has no file {path!r}")
            return data_key(principal.org_id, row.sha256), DatasetFileEntry(
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
            _lock_org(s, principal.org_id)
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

    # -- upload sessions ----------------------------------------------------------------------------------------

    def _upload_read(self, up: DataUpload, received: list[int]) -> UploadRead:
        parts = max(1, -(-up.size // up.part_size))
        return UploadRead(
            id=up.id,
            sha256=up.sha256,
            size=up.size,
            complete=False,
            mode="presigned" if up.mode == "presigned" else "api",
            part_size=up.part_size,
            parts=parts,
            received=received,
        )

    def _done(self, sha256: str, size: int) -> UploadRead:
        return UploadRead(
            id=None, sha256=sha256, size=size, complete=True, mode="none", part_size=self.part_size, parts=0
        )

    def _session_part_size(self, size: int, preferred: int | None) -> int:
        """A new session's part size: the client's preference when parts go straight to S3 and it is within S3's
        limits for this size, else the server's own (``dataset_part_bytes``; through the API: 16 MiB)."""
        if (
            self.presigned
            and preferred is not None
            and S3_MIN_PART <= preferred <= S3_MAX_PART
            and -(-size // preferred) <= S3_MAX_PARTS
        ):
            return preferred
        return self.part_size

    def open_upload(self, principal: Principal, sha256: str, size: int, part_size: int | None = None) -> UploadRead:
        """The upload session of a blob: new, or the open one with the parts already received (and its part size,
        whatever ``part_size`` now prefers)."""
        principal.require("blobs:write")
        org = principal.org_id
        key = data_key(org, sha256)
        with self.db.read() as s:
            blob = s.get(DataBlob, (org, sha256))
            if blob is not None:
                return self._done(sha256, blob.size)
            up = s.scalar(select(DataUpload).where(DataUpload.org_id == org, DataUpload.sha256 == sha256))
        if up is not None:
            if up.size != size:
                raise BadRequest(f"blob {sha256}: an upload of {up.size} bytes is open, not {size}")
            return self._upload_read(up, self._received(up))
        if size == 0:
            return self._store_empty(principal, sha256)
        with self.db.read() as s:
            self._check_quota(s, principal, size)
        mode = "presigned" if self.presigned else "api"
        store_id = self.store.multipart_start(key)
        try:
            with self.db.transaction() as s:
                _lock_org(s, org)
                self._check_quota(s, principal, size)
                up = DataUpload(
                    id=new_id("up"),
                    org_id=org,
                    sha256=sha256,
                    size=size,
                    part_size=self._session_part_size(size, part_size),
                    mode=mode,
                    store_upload_id=store_id,
                )
                s.add(up)
                s.flush()
                s.expunge(up)
        except BaseException as exc:
            self.store.multipart_abort(key, store_id)
            if isinstance(exc, IntegrityError):  # a concurrent open of the same blob won: resume that one
                return self.open_upload(principal, sha256, size, part_size)
            raise
        return self._upload_read(up, [])

    def _check_quota(self, s: Session, principal: Principal, adding: int) -> None:
        if self.quotas is not None:
            self.quotas.check_storage(s, principal.org_id, principal.org_name, adding)

    def _store_empty(self, principal: Principal, sha256: str) -> UploadRead:
        if sha256 != EMPTY_SHA256:
            raise DigestMismatch(f"an empty blob's SHA-256 is {EMPTY_SHA256}, not {sha256}")
        with tempfile.NamedTemporaryFile(dir=self.tmp_dir) as tmp:
            self.store.put_file(Path(tmp.name), data_key(principal.org_id, sha256))
        with self.db.transaction() as s:
            if s.get(DataBlob, (principal.org_id, sha256)) is None:
                s.add(DataBlob(org_id=principal.org_id, sha256=sha256, size=0))
        return self._done(sha256, 0)

    def _session(self, s: Session, principal: Principal, upload_id: str) -> DataUpload:
        up = s.get(DataUpload, upload_id)
        if up is None or up.org_id != principal.org_id:
            raise NotFound(f"upload {upload_id} not found")
        return up

    @staticmethod
    def _part_bounds(up: DataUpload, number: int) -> int:
        parts = max(1, -(-up.size // up.part_size))
        if not 1 <= number <= parts:
            raise BadRequest(f"part {number}: this upload has parts 1 to {parts}")
        return up.part_size if number < parts else up.size - up.part_size * (parts - 1)

    def _received(self, up: DataUpload) -> list[int]:
        with self.db.read() as s:
            declared = {p.number: p for p in s.scalars(select(DataUploadPart).where(DataUploadPart.upload_id == up.id))}
        if up.mode == "api":
            return sorted(n for n, p in declared.items() if p.received)
        stored = self.store.multipart_parts(data_key(up.org_id, up.sha256), up.store_upload_id)
        return sorted(
            n for n, (size, etag) in stored.items() if n in declared and self._part_ok(declared[n], size, etag)
        )

    @staticmethod
    def _part_ok(part: DataUploadPart, size: int, etag: str) -> bool:
        if size != part.size:
            return False
        # An S3 part's ETag is the MD5 of its bytes (unless the bucket encrypts with KMS: then the store's own
        # Content-MD5 check, which the presigned URL requires, is what vouches for it).
        return not re.fullmatch(r"[0-9a-f]{32}", etag) or etag == part.md5

    def put_part(self, principal: Principal, upload_id: str, number: int, data: bytes, sha256: str | None) -> PartRead:
        """One part through the API; its SHA-256 (header X-Kiln-Part-SHA256) must match its bytes."""
        principal.require("blobs:write")
        with self.db.read() as s:
            up = self._session(s, principal, upload_id)
            expected = self._part_bounds(up, number)
            if self.quotas is not None:
                self._check_still_within_quota(s, principal)
        if up.mode != "api":
            raise BadRequest(f"upload {upload_id} takes its parts through presigned URLs (POST .../url)")
        if sha256 is None or not SHA256.fullmatch(sha256):
            raise BadRequest("X-Kiln-Part-SHA256: the part's SHA-256 (lowercase hex) is required")
        if len(data) != expected:
            raise BadRequest(f"part {number} is {len(data)} bytes; this upload's part {number} is {expected} bytes")
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise DigestMismatch(f"part {number}: content hash is {actual}, not {sha256} as declared; nothing stored")
        self.store.multipart_put_part(data_key(up.org_id, up.sha256), up.store_upload_id, number, data)
        with self.db.transaction() as s:
            part = s.get(DataUploadPart, (upload_id, number))
            if part is None:
                s.add(DataUploadPart(upload_id=upload_id, number=number, size=len(data), sha256=sha256, received=True))
            else:
                part.size, part.sha256, part.received = len(data), sha256, True
        return PartRead(number=number, size=len(data))

    def _check_still_within_quota(self, s: Session, principal: Principal) -> None:
        """The session's size is already counted: refuse parts once usage is over a (since lowered) limit."""
        assert self.quotas is not None
        try:
            self.quotas.check_storage(s, principal.org_id, principal.org_name, 0)
        except Forbidden as exc:
            raise Forbidden(f"{exc.message}; the open upload counts in full") from exc

    def part_url(self, principal: Principal, upload_id: str, number: int, body: PartUrlRequest) -> PartUrl:
        """Where to PUT part ``number`` straight to the store; the store checks its Content-MD5."""
        (url,) = self._presign_parts(principal, upload_id, [(number, body.size, body.md5, body.sha256)])
        return PartUrl(url=url.url, headers=url.headers, expires_in=url.expires_in)

    def part_urls(self, principal: Principal, upload_id: str, body: PartUrlsRequest) -> PartUrls:
        """``part_url`` for many parts in one request (one session lookup, one transaction)."""
        numbers = [p.number for p in body.parts]
        if len(set(numbers)) != len(numbers):
            raise BadRequest("parts: each part number at most once per request")
        return PartUrls(
            items=self._presign_parts(principal, upload_id, [(p.number, p.size, p.md5, p.sha256) for p in body.parts])
        )

    def _presign_parts(
        self, principal: Principal, upload_id: str, parts: list[tuple[int, int, str, str]]
    ) -> list[NumberedPartUrl]:
        """Record each part's declared (size, MD5, SHA-256) and presign its upload: the store refuses a body whose
        MD5 or SHA-256 is not the declared one, and ``complete_upload`` checks the stored parts against these
        records again (and hands the store their SHA-256 checksums)."""
        principal.require("blobs:write")
        with self.db.read() as s:
            up = self._session(s, principal, upload_id)
            for number, size, _md5, _sha in parts:
                expected = self._part_bounds(up, number)
                if size != expected:
                    raise BadRequest(f"part {number} is {expected} bytes in this upload, not {size}")
            if self.quotas is not None:
                self._check_still_within_quota(s, principal)
        if up.mode != "presigned":
            raise BadRequest(f"upload {upload_id} takes its parts through the API (PUT .../parts/{parts[0][0]})")
        with self.db.transaction() as s:
            numbers = [number for number, _size, _md5, _sha in parts]
            existing = {
                p.number: p
                for p in s.scalars(
                    select(DataUploadPart).where(
                        DataUploadPart.upload_id == upload_id, DataUploadPart.number.in_(numbers)
                    )
                )
            }
            for number, size, md5, sha in parts:
                part = existing.get(number)
                if part is None:
                    s.add(DataUploadPart(upload_id=upload_id, number=number, size=size, md5=md5, sha256=sha))
                else:
                    part.size, part.md5, part.sha256, part.received = size, md5, sha, False
        expires = self.settings.storage_presign_seconds
        digests = {number: (b64_digest(md5), b64_digest(sha)) for number, _size, md5, sha in parts}
        urls = self.store.multipart_presign_parts(
            data_key(up.org_id, up.sha256),
            up.store_upload_id,
            [(n, md5, sha) for n, (md5, sha) in digests.items()],
            expires,
        )
        return [
            NumberedPartUrl(number=n, url=urls[n], headers=self.store.part_headers(*digests[n]), expires_in=expires)
            for n in numbers
        ]

    def complete_upload(self, principal: Principal, upload_id: str) -> UploadRead:
        """Assemble the blob from its parts (all present and verified) and record it."""
        principal.require("blobs:write")
        with self.db.read() as s:
            up = self._session(s, principal, upload_id)
            declared = {p.number: p for p in s.scalars(select(DataUploadPart).where(DataUploadPart.upload_id == up.id))}
            s.expunge_all()
        key = data_key(up.org_id, up.sha256)
        parts = max(1, -(-up.size // up.part_size))
        stored = self.store.multipart_parts(key, up.store_upload_id)
        missing = [n for n in range(1, parts + 1) if n not in stored or n not in declared]
        if up.mode == "api":
            missing += [n for n in range(1, parts + 1) if n in declared and not declared[n].received]
        if missing:
            missing = sorted(set(missing))
            raise Conflict(
                f"upload {upload_id}: {len(missing)} of {parts} part(s) not received yet (first: {missing[0]})",
                details={"missing": missing[:1000]},
            )
        if up.mode == "presigned":
            for n in range(1, parts + 1):
                size, etag = stored[n]
                if not self._part_ok(declared[n], size, etag):
                    with self.db.transaction() as s:
                        bad = s.get(DataUploadPart, (upload_id, n))
                        if bad is not None:
                            s.delete(bad)
                    raise DigestMismatch(
                        f"upload {upload_id}: part {n} in the store ({size} bytes, MD5 {etag}) is not the part "
                        f"declared ({declared[n].size} bytes, MD5 {declared[n].md5}); send it again"
                    )
        ordered = [(n, stored[n][1]) for n in range(1, parts + 1)]
        try:
            checksums = {n: b64_digest(p.sha256) for n, p in declared.items() if p.sha256}
            actual = self.store.multipart_complete(
                key, up.store_upload_id, ordered, expected_sha256=up.sha256, checksums=checksums
            )
        except DigestMismatch:
            # Every part matched its own hash but the whole does not: the declared hash was wrong. Start over.
            self._drop_session(up)
            raise
        if actual is None and self.store.size(key) != up.size:  # S3: the store assembled it
            self.store.delete(key)
            raise DigestMismatch(f"upload {upload_id}: the assembled blob is not {up.size} bytes; upload it again")
        with self.db.transaction() as s:
            _lock_org(s, up.org_id)
            if s.get(DataBlob, (up.org_id, up.sha256)) is None:
                s.add(DataBlob(org_id=up.org_id, sha256=up.sha256, size=up.size))
            s.execute(delete(DataUploadPart).where(DataUploadPart.upload_id == upload_id))
            s.execute(delete(DataUpload).where(DataUpload.id == upload_id))
        return self._done(up.sha256, up.size)

    def _drop_session(self, up: DataUpload) -> None:
        self.store.multipart_abort(data_key(up.org_id, up.sha256), up.store_upload_id)
        with self.db.transaction() as s:
            s.execute(delete(DataUploadPart).where(DataUploadPart.upload_id == up.id))
            s.execute(delete(DataUpload).where(DataUpload.id == up.id))

    # -- removal ------------------------------------------------------------------------------------------------

    def remove(self, principal: Principal, name: str, version: int | None) -> DatasetRemoved:
        """Remove one version (``version``) or the whole dataset, and the blobs nothing else references."""
        principal.require("blobs:write")
        validate_name(name)
        org = principal.org_id
        with self.db.transaction() as s:
            _lock_org(s, org)
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
                    raise NotFound(f"dataset {name}@{version} not found")
            else:
                if not ready:
                    raise NotFound(f"dataset {name!r} not found")
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
        jobs = s.execute(select(Job.id, Job.state, Job.spec).where(Job.org_id == org_id, Job.state.in_(PINNING_STATES)))
        for job_id, state, spec in jobs:
            inputs: Any = spec.get("inputs") if isinstance(spec, dict) else None
            if not isinstance(inputs, list):
                continue
            for item in inputs:
                ref = item.get("dataset") if isinstance(item, dict) else None
                if not isinstance(ref, str):
                    continue
                ref_name, _, ref_version = ref.partition("@")
                if ref_name != name:
                    continue
                pinned = int(ref_version) if ref_version.isdigit() else latest
                if pinned is not None and pinned in numbers:
                    raise Conflict(
                        f"dataset {name}@{pinned} is an input of job {job_id} ({state}); remove it once the job "
                        "has ended (or cancel the job)"
                    )
