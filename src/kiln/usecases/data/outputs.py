"""Reading what jobs leave behind: their logs, their artifacts and their checkpoints.

Artifacts (``$KILN_OUTPUT_DIR``) and checkpoints (``$KILN_CHECKPOINT_DIR``) are files of a job under a prefix of
the store each (:data:`PREFIXES`); a job on another machine (a pod) uploads both with its job token, and reads
its checkpoints back when a later attempt starts. The same rules hold for both kinds: safe paths only, a signed
content hash must match, the organisation's storage quota, and nothing once the job has ended."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import posixpath
import tempfile
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

from starlette.concurrency import run_in_threadpool

from kiln.domain import limits
from kiln.domain.schemas import ArtifactRead, TensorBoardImage, TensorBoardImageList
from kiln.domain.states import JobState
from kiln.errors import Conflict, DigestMismatch, InvalidInput, NotFound
from kiln.metrics import tbimages
from kiln.storage.keys import blob_key, checkpoints_prefix, events_prefix, outputs_prefix
from kiln.storage.logs import LogStore
from kiln.storage.store import ObjectStore, safe_key
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService
from kiln.usecases.jobs.jobs import JobService

FileKind = Literal["artifact", "checkpoint", "event"]
PREFIXES = {"artifact": outputs_prefix, "checkpoint": checkpoints_prefix, "event": events_prefix}
EVENT_FILE = "events.out.tfevents."  # what a job's TensorBoard dir may send as "event" files


# While a file streams in, the storage quota is checked every this many bytes: a body over the quota is cut
# short instead of filling the server's disk first.
QUOTA_CHECK_BYTES = 64 * 1024**2

# A listing of a job's TensorBoard images reads no more event files once it has read this much of them (each file
# at most tbimages.MAX_FILE_BYTES), and gives at most tbimages.MAX_IMAGES images in all.
MAX_IMAGE_LISTING_BYTES = 1024**3
# Event files' listings kept by (key, size): a file's records never change, and one that grew is listed again.
# At most this many images in all (about 200 bytes each).
MAX_CACHED_IMAGES = 200_000


class OutputService:
    def __init__(
        self, jobs: JobService, logs: LogStore, store: ObjectStore, tmp_dir: Path, quotas: QuotaService | None = None
    ) -> None:
        self.tmp_dir = tmp_dir
        self.quotas = quotas
        self.jobs = jobs
        self.logs = logs
        self.store = store
        self._listings: OrderedDict[tuple[str, int], tbimages.ImageListing] = OrderedDict()
        self._listings_lock = threading.Lock()

    def read_log(self, principal: Principal, job_id: str, offset: int, limit: int) -> tuple[bytes, int, bool]:
        """(whole lines from offset, next offset, whether the job has ended). Through any server: what this
        server's file lacks comes from the store's copy (kiln.storage.logs)."""
        org_id, ended = self._log_of(principal, job_id)
        data, next_offset = self.logs.read(job_id, offset, limit, org_id=org_id)
        return data, next_offset, ended

    def _log_of(self, principal: Principal, job_id: str) -> tuple[str, bool]:
        """(the job's organisation, whether it has ended): one row read, the caller's access checked."""
        principal.require("jobs:read")
        with self.jobs.db.read() as s:
            job = self.jobs.load(s, principal, job_id)
            return job.org_id, JobState(job.state).terminal

    async def follow_log(
        self, principal: Principal, job_id: str, offset: int, poll: float = 0.2, remote_poll: float = 1.0
    ) -> AsyncIterator[bytes]:
        """Log bytes as they are written, until the job has ended and everything was sent. The caller checks
        the job exists first (a generator's errors come after the response has started). Async, so that a
        follower waits on the event loop, not in a worker thread (threads are kept few; see kiln.api.app).
        A job whose log this server does not write is read from the store's copy every ``remote_poll``
        seconds: lines reach the follower within the writer's shipping interval and that. Its writer ships the
        whole log before it records the end, so a follower that saw the end and then read to the store's end
        has every line the job wrote."""
        while True:
            org_id, ended = await run_in_threadpool(self._log_of, principal, job_id)
            while True:
                data, offset = await run_in_threadpool(self.logs.read, job_id, offset, 1024 * 1024, org_id)
                if not data:
                    break
                yield data
            if ended:
                return
            await asyncio.sleep(poll if self.logs.path(job_id).exists() else remote_poll)

    async def upload_file(
        self,
        principal: Principal,
        job_id: str,
        kind: FileKind,
        path: str,
        chunks: AsyncIterator[bytes],
        expected_sha256: str | None = None,
    ) -> ArtifactRead:
        """Store one artifact or checkpoint file of a running job (what a job on another machine does with its
        token). When the request signed a content hash, the bytes must match it or nothing is stored."""
        principal.require("jobs:report")
        job = await run_in_threadpool(self.jobs.get, principal, job_id)
        if JobState(job.state).terminal:
            raise Conflict(f"job {job_id} has ended; its {kind}s are final")
        if kind == "event" and not safe_key(path).rsplit("/", 1)[-1].startswith(EVENT_FILE):
            raise InvalidInput(f"{path!r}: TensorBoard event files only ({EVENT_FILE}*)", details={"field": "path"})
        key = f"{PREFIXES[kind](job.org_id, job.id)}/{safe_key(path)}"
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix=f"{kind}-")
        tmp = Path(name)
        try:
            size = 0
            digest = hashlib.sha256()
            next_check = QUOTA_CHECK_BYTES
            with os.fdopen(fd, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    digest.update(chunk)
                    fh.write(chunk)
                    if size >= next_check:  # over the storage quota: stop reading now, not at the end
                        await run_in_threadpool(self._check_quota, principal, size)
                        next_check += QUOTA_CHECK_BYTES
            if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
                raise DigestMismatch(f"content hash is {digest.hexdigest()}, not {expected_sha256} as signed")
            await run_in_threadpool(self._store_file, principal, tmp, key, size)
        finally:
            tmp.unlink(missing_ok=True)
        return ArtifactRead(path=safe_key(path), size=size)

    def _check_quota(self, principal: Principal, size: int) -> None:
        if self.quotas is not None:
            with self.quotas.db.transaction() as s:
                self.quotas.check_storage(s, principal.org_id, principal.org_name, size)

    def _store_file(self, principal: Principal, tmp: Path, key: str, size: int) -> None:
        self._check_quota(principal, size)
        self.store.put_file(tmp, key)

    def append_log(self, principal: Principal, job_id: str, body: bytes, stream: str = "O") -> int:
        """Append lines to the job's log (a job on another machine streams its output here): ``stream`` is O
        (stdout) or E (stderr), tagged with the member in a gang (O@worker1)."""
        principal.require("jobs:report")
        job = self.jobs.get(principal, job_id)
        if JobState(job.state).terminal:
            raise Conflict(f"job {job_id} has ended; its log is closed")
        lines = body.decode("utf-8", errors="replace").splitlines()
        self.logs.append(job_id, stream, lines)
        return len(lines)

    def list_files(self, principal: Principal, job_id: str, kind: FileKind) -> list[ArtifactRead]:
        job = self.jobs.get(principal, job_id)
        return [ArtifactRead(path=p, size=n) for p, n in self.store.list(PREFIXES[kind](job.org_id, job.id))]

    def code_key(self, principal: Principal, job_id: str) -> tuple[str, int]:
        """The job's code bundle: what a pod's init container fetches with the job token."""
        job = self.jobs.get(principal, job_id)
        if not job.code_sha256:
            raise NotFound(f"job {job_id} has no code bundle")
        key = blob_key(job.org_id, job.code_sha256)
        return key, self.store.size(key)

    def file_key(self, principal: Principal, job_id: str, kind: FileKind, path: str) -> tuple[str, int]:
        job = self.jobs.get(principal, job_id)
        key = f"{PREFIXES[kind](job.org_id, job.id)}/{safe_key(path)}"
        if not self.store.exists(key):
            raise NotFound(f"job {job_id} has no {kind} {path!r}")
        return key, self.store.size(key)

    # -- TensorBoard images ---------------------------------------------------------------------------------------

    def tensorboard_images(self, principal: Principal, job_id: str) -> TensorBoardImageList:
        """Every image in the job's TensorBoard event files kept in the store (what ``EventSync`` and a pod's
        sidecar copied there), sorted by tag and step. Tags of a file in a subdirectory are ``<dir>/<tag>``, as
        its scalars are named. Bounded: ``MAX_IMAGE_LISTING_BYTES`` read and ``tbimages.MAX_IMAGES`` images in
        all; ``truncated`` and ``notes`` say when something was left out."""
        job = self.jobs.get(principal, job_id)
        prefix = PREFIXES["event"](job.org_id, job.id)
        items: list[TensorBoardImage] = []
        notes: list[str] = []
        truncated = False
        budget = MAX_IMAGE_LISTING_BYTES
        for path, size in self.store.list(prefix):
            if not posixpath.basename(path).startswith(EVENT_FILE):
                continue
            left = tbimages.MAX_IMAGES - len(items)
            if budget <= 0 or left <= 0:
                truncated = True
                notes.append(f"{path}: not read (the listing's limit was reached)")
                continue
            try:
                listing = self._event_images(f"{prefix}/{path}", size)
            except NotFound:
                continue  # removed since it was listed
            budget -= listing.read
            truncated = truncated or listing.truncated or len(listing.images) > left
            if listing.note:
                notes.append(f"{path}: {listing.note}")
            elif len(listing.images) > left:
                notes.append(f"{path}: only its first {left} images are listed")
            run = posixpath.dirname(path)
            items.extend(
                TensorBoardImage(
                    tag=f"{run}/{image.tag}" if run else image.tag,
                    step=image.step,
                    wall_time=image.wall_time if math.isfinite(image.wall_time) else 0.0,
                    file=path,
                    offset=image.offset,
                    index=image.index,
                    width=image.width,
                    height=image.height,
                    size=image.size,
                    media_type=image.media_type,
                )
                for image in listing.images[:left]
            )
        items.sort(key=lambda i: (i.tag, i.step, i.wall_time, i.file, i.offset, i.index))
        return TensorBoardImageList(items=items, truncated=truncated, notes=notes)

    def _event_images(self, key: str, size: int) -> tbimages.ImageListing:
        """One event file's listing: from the cache while the file has not grown (records never change)."""
        with self._listings_lock:
            cached = self._listings.get((key, size))
            if cached is not None:
                self._listings.move_to_end((key, size))
                return cached
        with self.store.open(key) as fh:
            listing = tbimages.list_images(fh, size=size)
        with self._listings_lock:
            self._listings[(key, size)] = listing
            while sum(len(x.images) + 1 for x in self._listings.values()) > MAX_CACHED_IMAGES:
                self._listings.popitem(last=False)
        return listing

    def tensorboard_image(
        self, principal: Principal, job_id: str, file: str, offset: int, index: int
    ) -> tuple[bytes, str]:
        """(bytes, media type) of one image of the job's TensorBoard event files: ``file`` relative to its
        TensorBoard dir, the record at byte ``offset`` (as listed), the ``index``-th image of that record."""
        job = self.jobs.get(principal, job_id)
        if not 0 <= offset <= limits.MAX_INT64:
            raise InvalidInput(f"offset {offset} is not a byte offset", details={"field": "offset"})
        if not 0 <= index < tbimages.MAX_IMAGES:
            raise InvalidInput(f"index {index} is not 0 to {tbimages.MAX_IMAGES - 1}", details={"field": "index"})
        path = safe_key(file)
        if not posixpath.basename(path).startswith(EVENT_FILE):
            raise InvalidInput(f"{file!r}: TensorBoard event files only ({EVENT_FILE}*)", details={"field": "file"})
        key = f"{PREFIXES['event'](job.org_id, job.id)}/{path}"
        if not self.store.exists(key):
            raise NotFound(f"job {job_id} has no TensorBoard event file {file!r}")
        size = self.store.size(key)
        try:
            with self.store.open(key) as fh:
                return tbimages.read_image(fh, offset, index, size=size)
        except tbimages.NoImage as exc:
            raise NotFound(f"TensorBoard event file {file!r} of job {job_id}: {exc}") from None
