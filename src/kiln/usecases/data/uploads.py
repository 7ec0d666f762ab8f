"""Blob upload sessions: steps 2 to 4 of the dataset upload protocol (described in ``kiln.usecases.data.datasets``).

``UploadService`` opens one session per (organisation, sha256) and resumes it when asked again, takes parts
through the API (``put_part``) or presigns them straight to S3 (``part_url``, ``part_urls``), and assembles and
records the blob once every part is present and verified (``complete_upload``). ``DatasetService`` builds on it.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import DataBlob, DataUpload, DataUploadPart
from kiln.domain import limits
from kiln.domain.datasets import (
    NumberedPartUrl,
    PartRead,
    PartUrl,
    PartUrlRequest,
    PartUrls,
    PartUrlsRequest,
    UploadConfig,
    UploadRead,
)
from kiln.domain.ids import new_id
from kiln.errors import BadRequest, Conflict, DigestMismatch, Forbidden, NotFound, PayloadTooLarge
from kiln.settings import Settings
from kiln.storage.store import ObjectStore, b64_digest
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService, lock_org
from kiln.usecases.data.blob_batches import BlobBatches
from kiln.usecases.data.dataset_names import SHA256, data_key

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Parts sent through the API travel in one signed request body, which the API caps at 16 MiB.
API_PART_BYTES = limits.MAX_SIGNED_BODY_BYTES
# S3's multipart limits: parts of 5 MiB to 5 GiB (the last may be shorter), at most 10,000 of them. Every session
# keeps to them, whatever the store: a blob is at most 10,000 parts (so through the API, 156.25 GiB).
S3_MIN_PART = limits.MIN_PART_BYTES
S3_MAX_PART = limits.MAX_PART_BYTES
S3_MAX_PARTS = limits.MAX_UPLOAD_PARTS
MISSING_LISTED = 1000  # part numbers a 409 of complete_upload lists


def part_count(size: int, part_size: int) -> int:
    """Parts of a blob of ``size`` bytes in parts of ``part_size`` (an empty blob has one, empty)."""
    return max(1, -(-size // part_size))


def missing_parts(parts: int, present: set[int], listed: int = MISSING_LISTED) -> tuple[int, list[int]]:
    """How many of parts 1..``parts`` are not in ``present``, and the first ``listed`` of them: work in proportion
    to what is present, never to ``parts`` (a session's part count is not enumerated)."""
    inside = {n for n in present if 1 <= n <= parts}
    count = parts - len(inside)
    first: list[int] = []
    number = 1
    while len(first) < min(count, listed):
        if number not in inside:
            first.append(number)
        number += 1
    return count, first


class UploadService(BlobBatches):
    """The upload sessions of the organisation's blobs, and the store and settings they use."""

    def __init__(self, db: Database, store: ObjectStore, settings: Settings, quotas: QuotaService | None) -> None:
        self.db = db
        self.store = store
        self.settings = settings
        self.quotas = quotas
        self.presigned = store.is_s3 and settings.storage_presign
        self.part_size = settings.dataset_part_bytes if self.presigned else API_PART_BYTES
        self.tmp_dir = settings.home / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def config(self, principal: Principal) -> UploadConfig:
        """How new upload sessions take their parts (``mode``) and the part sizes they may use."""
        principal.require("blobs:write")
        return UploadConfig(
            mode="presigned" if self.presigned else "api",
            part_size=self.part_size,
            min_part_size=S3_MIN_PART if self.presigned else self.part_size,
            max_parts=S3_MAX_PARTS,
            small_blob_bytes=self.settings.dataset_small_blob_bytes,
            small_blobs_body_bytes=API_PART_BYTES,  # the API's cap on a signed body
        )

    def _upload_read(self, up: DataUpload, received: list[int]) -> UploadRead:
        parts = part_count(up.size, up.part_size)
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
            and part_count(size, preferred) <= S3_MAX_PARTS
        ):
            return preferred
        return self.part_size

    def _check_size(self, size: int, part_size: int) -> None:
        """413 for a blob over the platform's maxima: 5 TiB (S3's largest object), or more than 10,000 parts of
        the session's part size (S3's limit on a multipart upload; through the API parts are 16 MiB)."""
        if size > limits.MAX_FILE_BYTES:
            raise PayloadTooLarge(
                f"size: {size} bytes is over the largest file the platform stores ({limits.MAX_FILE_BYTES} bytes)",
                details={"field": "size", "max": limits.MAX_FILE_BYTES},
            )
        parts = part_count(size, part_size)
        if parts > S3_MAX_PARTS:
            most = S3_MAX_PARTS * part_size
            hint = (
                f"; ask for a larger part_size (at most {S3_MAX_PART} bytes)"
                if self.presigned
                else " (parts through the API are at most 16 MiB)"
            )
            raise PayloadTooLarge(
                f"size: {size} bytes would take {parts} parts of {part_size} bytes, over the {S3_MAX_PARTS} an "
                f"upload may have: at most {most} bytes in this session{hint}",
                details={"field": "size", "max": most, "max_parts": S3_MAX_PARTS},
            )

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
        session_part_size = self._session_part_size(size, part_size)
        self._check_size(size, session_part_size)
        with self.db.read() as s:
            self._check_quota(s, principal, size)
        mode = "presigned" if self.presigned else "api"
        store_id = self.store.multipart_start(key)
        try:
            with self.db.transaction() as s:
                lock_org(s, org)
                self._check_quota(s, principal, size)
                up = DataUpload(
                    id=new_id("up"),
                    org_id=org,
                    sha256=sha256,
                    size=size,
                    part_size=session_part_size,
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
        parts = part_count(up.size, up.part_size)
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
            n for n, part in stored.items() if n in declared and self._part_ok(declared[n], part.size, part.etag)
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
        (url,) = self._presign_parts(principal, upload_id, [(number, body.size, body.md5, body.crc32)])
        return PartUrl(url=url.url, headers=url.headers, expires_in=url.expires_in)

    def part_urls(self, principal: Principal, upload_id: str, body: PartUrlsRequest) -> PartUrls:
        """``part_url`` for many parts in one request (one session lookup, one transaction)."""
        numbers = [p.number for p in body.parts]
        if len(set(numbers)) != len(numbers):
            raise BadRequest("parts: each part number at most once per request")
        return PartUrls(
            items=self._presign_parts(principal, upload_id, [(p.number, p.size, p.md5, p.crc32) for p in body.parts])
        )

    def _presign_parts(
        self, principal: Principal, upload_id: str, parts: list[tuple[int, int, str, str]]
    ) -> list[NumberedPartUrl]:
        """Record each part's declared (size, MD5) and presign its upload with its MD5 and CRC32: the store refuses a
        body whose MD5 or CRC32 is not the declared one, and ``complete_upload`` checks the stored parts' MD5s
        against these records again."""
        principal.require("blobs:write")
        with self.db.read() as s:
            up = self._session(s, principal, upload_id)
            for number, size, _md5, _crc in parts:
                expected = self._part_bounds(up, number)
                if size != expected:
                    raise BadRequest(f"part {number} is {expected} bytes in this upload, not {size}")
            if self.quotas is not None:
                self._check_still_within_quota(s, principal)
        if up.mode != "presigned":
            raise BadRequest(f"upload {upload_id} takes its parts through the API (PUT .../parts/{parts[0][0]})")
        with self.db.transaction() as s:
            numbers = [number for number, _size, _md5, _crc in parts]
            existing = {
                p.number: p
                for p in s.scalars(
                    select(DataUploadPart).where(
                        DataUploadPart.upload_id == upload_id, DataUploadPart.number.in_(numbers)
                    )
                )
            }
            for number, size, md5, _crc in parts:
                part = existing.get(number)
                if part is None:
                    s.add(DataUploadPart(upload_id=upload_id, number=number, size=size, md5=md5))
                else:
                    part.size, part.md5, part.received = size, md5, False
        expires = self.settings.storage_presign_seconds
        digests = {number: (b64_digest(md5), b64_digest(crc)) for number, _size, md5, crc in parts}
        urls = self.store.multipart_presign_parts(
            data_key(up.org_id, up.sha256),
            up.store_upload_id,
            [(n, md5, crc) for n, (md5, crc) in digests.items()],
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
        parts = part_count(up.size, up.part_size)
        if parts > S3_MAX_PARTS:  # a session opened before sessions were bounded: it can never complete
            self._drop_session(up)
            raise BadRequest(
                f"upload {upload_id}: {parts} parts is over the {S3_MAX_PARTS} an upload may have; the session is "
                "removed: open a new one"
            )
        stored = self.store.multipart_parts(key, up.store_upload_id)
        present = {n for n in stored if n in declared and (up.mode != "api" or declared[n].received)}
        count, missing = missing_parts(parts, present)
        if count:
            raise Conflict(
                f"upload {upload_id}: {count} of {parts} part(s) not received yet (first: {missing[0]})",
                details={"missing": missing},
            )
        if up.mode == "presigned":
            for n in range(1, parts + 1):
                size, etag, _ = stored[n]
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
            checksums = {n: part.checksum for n, part in stored.items() if part.checksum}
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
            lock_org(s, up.org_id)
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
