"""Content-addressed uploads: the server hashes every byte and stores nothing it has not verified."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from kiln.db.session import Database
from kiln.db.tables import Blob
from kiln.errors import DigestMismatch, NotFound, PayloadTooLarge
from kiln.settings import Settings
from kiln.storage.archive import validate_archive
from kiln.storage.keys import blob_key
from kiln.storage.store import ObjectStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService


class BlobService:
    def __init__(
        self, db: Database, store: ObjectStore, settings: Settings, quotas: QuotaService | None = None
    ) -> None:
        self.quotas = quotas
        self.db = db
        self.store = store
        self.settings = settings
        self.tmp_dir = settings.home / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def get(self, principal: Principal, sha256: str) -> Blob:
        principal.require("blobs:read")
        with self.db.read() as s:
            blob = s.get(Blob, (principal.org_id, sha256))
            if blob is None:
                raise NotFound(f"blob {sha256} not found")
            return blob

    async def upload(
        self, principal: Principal, sha256: str, chunks: AsyncIterator[bytes], declared_length: int | None
    ) -> Blob:
        principal.require("blobs:write")
        limit = self.settings.max_blob_bytes
        if declared_length is not None and declared_length > limit:
            raise PayloadTooLarge(f"upload of {declared_length} bytes exceeds the limit of {limit} bytes")
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp_dir, prefix="blob-")
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"upload exceeds the limit of {limit} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
            actual = digest.hexdigest()
            if actual != sha256:
                raise DigestMismatch(f"content hash is {actual}, not {sha256} as the URL says")
            return await run_in_threadpool(self._store, principal, sha256, tmp, size)
        finally:
            tmp.unlink(missing_ok=True)

    def _store(self, principal: Principal, sha256: str, tmp: Path, size: int) -> Blob:
        validate_archive(
            tmp,
            max_members=self.settings.max_archive_members,
            max_unpacked_bytes=self.settings.max_archive_unpacked_bytes,
        )
        key = blob_key(principal.org_id, sha256)
        with self.db.transaction() as s:
            existing = s.get(Blob, (principal.org_id, sha256))
            if existing is not None:
                return existing
            if self.quotas is not None:
                self.quotas.check_storage(s, principal.org_id, principal.org_name, size)
        if not self.store.exists(key):
            self.store.put_file(tmp, key)
        with self.db.transaction() as s:
            blob = s.get(Blob, (principal.org_id, sha256))
            if blob is None:
                blob = Blob(org_id=principal.org_id, sha256=sha256, size=size)
                s.add(blob)
            return blob
