"""Small dataset blobs, many to a request (``POST /api/v1/uploads/blobs``).

A dataset of many small files (images, shards of text) would otherwise cost one upload session per file: three
requests to Kiln and four calls to the store for each. Here a client sends up to 1,000 of them in one signed body:
a JSON line ``{"blobs": [{"sha256", "size"}, ...]}``, then their bytes in that order. The server checks every
SHA-256 before it writes anything (400 naming the first that differs: nothing stored), skips the blobs the
organisation already holds, checks the storage quota, writes the rest to the store at once (on S3: concurrent
PutObject calls, each with its Content-MD5) and records them in one transaction. The bytes pass through the API,
which is what makes it cheap: one request instead of three per file, and the server's own hash check rather than
the client's word.
"""

from __future__ import annotations

import hashlib
import logging

from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import DataBlob, DataUpload, DataUploadPart
from kiln.domain.datasets import SmallBlobsHeader, SmallBlobsRead
from kiln.errors import BadRequest, DigestMismatch, Forbidden, KilnError
from kiln.settings import Settings
from kiln.storage.store import ObjectStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService, lock_org
from kiln.usecases.data.dataset_names import data_key

log = logging.getLogger(__name__)

# The JSON line is at most this long (1,000 entries take ~90 KB).
MAX_HEADER_BYTES = 1024 * 1024


def parse_blobs(body: bytes) -> list[tuple[str, bytes]]:
    """The (sha256, bytes) of a body of small blobs, each checked against its declared SHA-256; 400 otherwise."""
    end = body.find(b"\n", 0, MAX_HEADER_BYTES)
    if end < 0:
        raise BadRequest('the body starts with one JSON line {"blobs": [{"sha256", "size"}, ...]}, then the bytes')
    try:
        header = SmallBlobsHeader.model_validate_json(body[:end])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"the blobs header: {where}: {first['msg']}") from None
    data = memoryview(body)[end + 1 :]
    declared = sum(b.size for b in header.blobs)
    if len(data) != declared:
        raise BadRequest(f"the body holds {len(data)} bytes after its header, which declares {declared}")
    out: list[tuple[str, bytes]] = []
    offset = 0
    for i, blob in enumerate(header.blobs, 1):
        chunk = bytes(data[offset : offset + blob.size])
        offset += blob.size
        actual = hashlib.sha256(chunk).hexdigest()
        if actual != blob.sha256:
            raise DigestMismatch(
                f"blob {i} of {len(header.blobs)}: content hash is {actual}, not {blob.sha256} as declared; "
                "nothing stored",
                details={"sha256": blob.sha256},
            )
        out.append((blob.sha256, chunk))
    return out


class BlobBatches:
    """``put_blobs`` of the upload service."""

    db: Database
    store: ObjectStore
    settings: Settings
    quotas: QuotaService | None

    def _check_quota(self, s: Session, principal: Principal, adding: int) -> None:
        if self.quotas is not None:
            self.quotas.check_storage(s, principal.org_id, principal.org_name, adding)

    def put_blobs(self, principal: Principal, body: bytes) -> SmallBlobsRead:
        """Store the small blobs of ``body`` (see the module's docstring) that the organisation lacks."""
        principal.require("blobs:write")
        if not self.settings.dataset_small_blob_bytes:
            raise BadRequest("this server takes every blob through an upload session (POST /uploads)")
        org = principal.org_id
        unique = dict(parse_blobs(body))  # the same content twice in one body is stored once
        with self.db.read() as s:
            held = self._held(s, org, list(unique))
            new = {sha: data for sha, data in unique.items() if sha not in held}
            self._check_quota(s, principal, sum(len(d) for d in new.values()))
        if new:
            try:
                self.store.put_objects([(data_key(org, sha), data) for sha, data in new.items()])
            except KilnError:  # the store failed part way (503): what it took is not recorded, so it goes
                self._forget(org, list(new))
                raise
        stale: list[tuple[str, str]] = []
        try:
            with self.db.transaction() as s:
                lock_org(s, org)
                adding = {sha: data for sha, data in new.items() if sha not in self._held(s, org, list(new))}
                self._check_quota(s, principal, sum(len(d) for d in adding.values()))
                for sha, data in adding.items():
                    s.add(DataBlob(org_id=org, sha256=sha, size=len(data)))
                # Upload sessions an interrupted put left for these blobs: their reservations end with them.
                sessions = s.scalars(
                    select(DataUpload).where(DataUpload.org_id == org, DataUpload.sha256.in_(list(unique)))
                ).all()
                stale = [(data_key(org, up.sha256), up.store_upload_id) for up in sessions]
                ids = [up.id for up in sessions]
                if ids:
                    s.execute(delete(DataUploadPart).where(DataUploadPart.upload_id.in_(ids)))
                    s.execute(delete(DataUpload).where(DataUpload.id.in_(ids)))
        except Forbidden:
            self._forget(org, list(new))  # a concurrent upload took the room: leave nothing behind
            raise
        for key, store_upload_id in stale:
            try:
                self.store.multipart_abort(key, store_upload_id)
            except KilnError as exc:
                log.warning("could not abort the stale upload of %s: %s", key, exc.message)
        return SmallBlobsRead(stored=len(new), present=len(unique) - len(new), bytes=sum(len(d) for d in new.values()))

    @staticmethod
    def _held(s: Session, org: str, shas: list[str]) -> set[str]:
        rows = s.scalars(select(DataBlob.sha256).where(DataBlob.org_id == org, DataBlob.sha256.in_(shas)))
        return set(rows)

    def _forget(self, org: str, shas: list[str]) -> None:
        """Delete the objects of ``shas`` that no blob record holds (best effort)."""
        with self.db.read() as s:
            held = self._held(s, org, shas)
        for sha in shas:
            if sha not in held:
                try:
                    self.store.delete(data_key(org, sha))
                except KilnError as exc:
                    log.warning("could not delete the unrecorded blob %s: %s", sha, exc.message)
