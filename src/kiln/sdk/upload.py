"""Dataset upload (``put_dataset``): hash the files, send the manifest, then upload the blobs the server lacks in
parts, through the API on a local store or straight to the store through presigned URLs on S3, acknowledging each
part in the resume file so that running the same ``put`` again sends only what is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from kiln.domain import dataset_refs
from kiln.domain.datasets import DatasetVersionRead, DraftRead, PartUrl, PartUrls, UploadConfig, UploadRead
from kiln.errors import BadRequest, DigestMismatch, StoreUnavailable
from kiln.sdk.config import client_dir
from kiln.sdk.hash_cache import HashCache, hash_cached
from kiln.sdk.local_files import (
    FileDigests,
    LocalFile,
    UploadState,
    hash_file,
    manifest_sha256,
    part_digests,
    read_part,
    scan_local,
)
from kiln.sdk.transfer import DEFAULT_WORKERS, Progress, TransferBase, run_all

# Called with (blob sha256, part number, the part's bytes) before a part is sent; returns the bytes to send.
# For tools and tests (e.g. to stop after some parts, or to corrupt one); the declared hashes are the original's.
PartHook = Callable[[str, int, bytes], bytes]
PART_SHA256_HEADER = "X-Kiln-Part-SHA256"
# Parts sent straight to S3: in flight at once, and the part size a new session asks for (boto3's defaults are
# 8 MiB parts, 10 threads). Small parts keep every connection busy to the end; the server may answer another size.
PUT_WORKERS = 8
PUT_PART_BYTES = 8 * 1024 * 1024
MAX_PARTS = 10_000
# Presigned part URLs are asked for in batches that double up to this many parts; a URL older than this share of
# its life when its turn comes is asked for again.
URL_BATCH = 64
# Threads computing the parts' MD5s while the files are hashed (hashlib releases the GIL: they run in parallel).
HASHERS = max(1, min(4, os.cpu_count() or 1))
URL_FRESH = 0.8
# Small files many to a request (POST /uploads/blobs): at most this many, and room for their JSON line (an entry
# is {"sha256":"<64 hex>","size":<digits>}, under 100 bytes).
BLOBS_PER_REQUEST = 1000
HEADER_BYTES = 64
HEADER_BYTES_PER_BLOB = 100


def preferred_part_size(size: int) -> int:
    """The part size a new upload of ``size`` bytes asks for: PUT_PART_BYTES, doubled until ≤ MAX_PARTS parts."""
    part = PUT_PART_BYTES
    while -(-size // part) > MAX_PARTS:
        part *= 2
    return part


@dataclass(frozen=True)
class _ReadyPart:
    """A part whose digests (hex MD5 and CRC32) are known and whose presigned URL is at hand (fetched at
    ``fetched``, time.monotonic)."""

    session: UploadRead
    source: Path
    number: int
    md5: str
    crc32: str
    url: PartUrl
    fetched: float


def _offer(ready: queue.Queue[_ReadyPart | None], item: _ReadyPart | None, stop: threading.Event) -> None:
    """Queue ``item`` as soon as there is room, unless everyone is stopping."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.2)
            return
        except queue.Full:
            continue


def _small_batches(files: list[tuple[str, LocalFile]], body_bytes: int) -> list[list[tuple[str, LocalFile]]]:
    """Small files (with their SHA-256, once per content) grouped in request bodies of at most ``body_bytes``
    (their JSON line included) and BLOBS_PER_REQUEST files, in order."""
    batches: list[list[tuple[str, LocalFile]]] = []
    batch: list[tuple[str, LocalFile]] = []
    used = HEADER_BYTES
    for sha, f in files:
        need = f.size + HEADER_BYTES_PER_BLOB
        if batch and (used + need > body_bytes or len(batch) >= BLOBS_PER_REQUEST):
            batches.append(batch)
            batch, used = [], HEADER_BYTES
        batch.append((sha, f))
        used += need
    if batch:
        batches.append(batch)
    return batches


def _done(value: tuple[str, str]) -> Future[tuple[str, str]]:
    future: Future[tuple[str, str]] = Future()
    future.set_result(value)
    return future


class UploadMixin(TransferBase):
    """``put_dataset`` of ``kiln.Client`` and its upload pipeline."""

    def put_dataset(
        self,
        path: Path | str,
        name: str,
        progress: Progress | None = None,
        *,
        on_total: Callable[[int], None] | None = None,
        workers: int | None = None,
        state_dir: Path | None = None,
        before_part: PartHook | None = None,
        rehash: bool = False,
    ) -> DatasetVersionRead:
        """Upload a file or directory as the next version of ``name`` (or return the latest version when it
        already holds exactly these files). ``on_total`` is told the bytes to send, ``progress`` each part sent.
        ``workers``: files hashed and parts in flight at once (default: PUT_WORKERS parts straight to S3,
        DEFAULT_WORKERS otherwise). ``state_dir``: where the resume file goes (default ``uploads`` in
        ``kiln.sdk.config.client_dir()``); the hash cache (``kiln.sdk.hash_cache``) is beside it, ``hashes.sqlite``.
        ``rehash``: read every file again, whatever the hash cache holds."""
        try:  # what the server would refuse once every file is hashed: refused now, with its message
            dataset_refs.check_name(name)
        except dataset_refs.DatasetRefError as exc:
            raise BadRequest(str(exc)) from None
        files = scan_local(Path(path))
        state_dir = state_dir or client_dir() / "uploads"
        threads = max(1, workers or DEFAULT_WORKERS)
        config = self._upload_config()
        small = config.small_blob_bytes  # files smaller than this go many to a request, without a session

        def part_size(f: LocalFile) -> int | None:
            # Parts going straight to S3 declare their MD5 and CRC32: computed in the same read as the file's
            # SHA-256 (on the hashing threads), so that sending does no hashing and competes with nothing for the CPU.
            return preferred_part_size(f.size) if config.mode == "presigned" and f.size >= small else None

        with (
            ThreadPoolExecutor(threads, thread_name_prefix="kiln-put") as pool,
            ThreadPoolExecutor(HASHERS, thread_name_prefix="kiln-put-md5") as hashers,
        ):
            cache = None if rehash else HashCache(state_dir.parent / "hashes.sqlite")
            try:
                digests: list[FileDigests] = list(
                    pool.map(
                        lambda f: hash_cached(cache, f.source, part_size(f), partial(hash_file, pool=hashers)),
                        files,
                    )
                )
            finally:
                if cache is not None:
                    cache.trim()
                    cache.close()
            hashes = [d.sha256 for d in digests]
            entries = [{"path": f.path, "size": f.size, "sha256": h} for f, h in zip(files, hashes, strict=True)]
            digest = manifest_sha256(entries)
            state = UploadState(state_dir, self.endpoint, name, digest)
            draft = DraftRead.model_validate(
                self.request("POST", "/datasets", json_body={"name": name, "files": entries}).json()
            )
            if draft.version is not None:
                state.clear()
                if on_total:
                    on_total(0)
                return self._version_of(name, draft.version)
            state.save(draft_id=draft.id)
            sources = {h: f for f, h in zip(files, hashes, strict=True)}
            known = {d.sha256: d for d in digests}
            if on_total:
                on_total(draft.missing_bytes)
            batches = _small_batches(
                [(sha, sources[sha]) for sha in draft.missing if sources[sha].size < small],
                config.small_blobs_body_bytes,
            )
            run_all(pool, [partial(self._send_blobs, batch, progress, before_part) for batch in batches])
            sessions: list[UploadRead] = run_all(
                pool,
                [
                    partial(self._open_upload, sha, sources[sha].size)
                    for sha in draft.missing
                    if sources[sha].size >= small
                ],
            )
            api_parts: list[Callable[[], Any]] = []
            to_store: list[tuple[UploadRead, Path, list[int], FileDigests]] = []
            for session in sessions:
                if session.complete or session.id is None:
                    if progress:
                        progress(session.size)
                    continue
                received = set(session.received)
                if progress and received:
                    progress(sum(self._part_length(session, n) for n in received))
                pending = [n for n in range(1, session.parts + 1) if n not in received]
                source = sources[session.sha256].source
                if session.mode == "presigned":
                    if pending:
                        to_store.append((session, source, pending, known[session.sha256]))
                else:
                    api_parts += [
                        partial(self._send_part, session, n, source, state, progress, before_part) for n in pending
                    ]
            run_all(pool, api_parts)
            self._send_presigned(to_store, state, progress, before_part, hashers, max(1, workers or PUT_WORKERS))
            open_sessions = [s for s in sessions if not s.complete and s.id is not None]
            run_all(pool, [partial(self.request, "POST", f"/uploads/{s.id}/complete") for s in open_sessions])
        version = DatasetVersionRead.model_validate(self.request("POST", f"/datasets/drafts/{draft.id}/commit").json())
        state.clear()
        return version

    def _send_blobs(
        self, batch: list[tuple[str, LocalFile]], progress: Progress | None, before_part: PartHook | None
    ) -> None:
        """Small files, many in one request: a JSON line naming each blob, then their bytes in that order."""
        header = {"blobs": [{"sha256": sha, "size": f.size} for sha, f in batch]}
        chunks = [json.dumps(header, separators=(",", ":")).encode(), b"\n"]
        for sha, f in batch:
            data = read_part(f.source, 0, f.size)
            chunks.append(before_part(sha, 1, data) if before_part and data else data)  # an empty blob has no part
        try:
            self.request(
                "POST",
                "/uploads/blobs",
                content=b"".join(chunks),
                extra_headers={"Content-Type": "application/octet-stream"},
            )
        except DigestMismatch as exc:
            bad = next(
                (f for sha, f in batch if isinstance(exc.details, dict) and exc.details.get("sha256") == sha), None
            )
            if bad is None:
                raise
            raise DigestMismatch(
                f"{bad.source} arrived with other bytes than were hashed (it changed while the put ran, or was "
                f"corrupted on the way): {exc.message}; run the put again",
                details=exc.details,
            ) from None
        if progress:
            progress(sum(f.size for _, f in batch))

    def _upload_config(self) -> UploadConfig:
        return UploadConfig.model_validate(self.request("GET", "/uploads/config").json())

    def _open_upload(self, sha256: str, size: int) -> UploadRead:
        body = {"sha256": sha256, "size": size, "part_size": preferred_part_size(size)}
        return UploadRead.model_validate(self.request("POST", "/uploads", json_body=body).json())

    def _version_of(self, name: str, version: int) -> DatasetVersionRead:
        data = self.request("GET", f"/datasets/{quote(name, safe='')}/versions/{version}").json()
        return DatasetVersionRead.model_validate(data)

    @staticmethod
    def _part_length(session: UploadRead, number: int) -> int:
        if number < session.parts:
            return session.part_size
        return session.size - session.part_size * (session.parts - 1)

    def _send_part(
        self,
        session: UploadRead,
        number: int,
        source: Path,
        state: UploadState,
        progress: Progress | None,
        before_part: PartHook | None,
    ) -> None:
        """One part through the API (a store without presigned URLs): its SHA-256 travels in a header."""
        assert session.id is not None
        length = self._part_length(session, number)
        data = read_part(source, (number - 1) * session.part_size, length)
        part_sha = hashlib.sha256(data).hexdigest()
        body = before_part(session.sha256, number, data) if before_part else data
        self.request(
            "PUT",
            f"/uploads/{session.id}/parts/{number}",
            content=body,
            extra_headers={PART_SHA256_HEADER: part_sha, "Content-Type": "application/octet-stream"},
        )
        state.ack(session.sha256, session.id, number)
        if progress:
            progress(length)

    # Parts straight to S3, as a pipeline: per blob, a producer asks the server for presigned URLs in batches (one
    # round trip for up to URL_BATCH parts), ahead of the senders; ``workers`` senders re-read each part (from the
    # page cache) and PUT it to the store on their own connection. The parts' digests are those computed with the
    # file's SHA-256; a resumed session with another part size has them computed again, part by part, on the
    # hashing threads.

    def _send_presigned(
        self,
        uploads: list[tuple[UploadRead, Path, list[int], FileDigests]],
        state: UploadState,
        progress: Progress | None,
        before_part: PartHook | None,
        hashers: ThreadPoolExecutor,
        workers: int,
    ) -> None:
        if not uploads:
            return
        self._store_http()  # created once, before the threads share it
        stop = threading.Event()  # a failure anywhere: everyone stops taking new work
        # Parts ready to send; once every producer is done, one None per sender tells it that nothing more comes.
        ready: queue.Queue[_ReadyPart | None] = queue.Queue(maxsize=max(URL_BATCH, 2 * workers))
        failures: list[BaseException] = []

        def check(future: Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                failures.append(future.exception())  # type: ignore[arg-type]
                stop.set()

        with (
            ThreadPoolExecutor(min(len(uploads), 4), thread_name_prefix="kiln-put-urls") as producers,
            ThreadPoolExecutor(workers, thread_name_prefix="kiln-put-parts") as senders,
        ):
            made = [
                producers.submit(self._produce_urls, s, src, numbers, known, ready, stop, hashers)
                for s, src, numbers, known in uploads
            ]
            sending = [
                senders.submit(self._send_ready, ready, stop, state, progress, before_part) for _ in range(workers)
            ]
            for future in made + sending:
                future.add_done_callback(check)
            try:
                wait(made, return_when=ALL_COMPLETED)
                for _ in sending:
                    _offer(ready, None, stop)
                wait(sending, return_when=ALL_COMPLETED)
            finally:
                stop.set()
        if failures:
            raise failures[0]

    def _part_urls(self, upload_id: str, parts: list[dict[str, Any]]) -> PartUrls:
        answer = self.request("POST", f"/uploads/{upload_id}/parts/urls", json_body={"parts": parts})
        return PartUrls.model_validate(answer.json())

    def _produce_urls(
        self,
        session: UploadRead,
        source: Path,
        numbers: list[int],
        known: FileDigests,
        ready: queue.Queue[_ReadyPart | None],
        stop: threading.Event,
        hashers: ThreadPoolExecutor,
    ) -> None:
        assert session.id is not None

        def digests_of(number: int) -> tuple[str, str]:
            if stop.is_set():
                return "", ""
            length = self._part_length(session, number)
            return part_digests(read_part(source, (number - 1) * session.part_size, length))

        # URLs are asked for as soon as a part's digests are known, together with every following one already
        # known (at most URL_BATCH). Digests computed again are computed in order on the hashing threads: small
        # batches while the hashing is behind the senders, large ones once it is ahead.
        digests: list[Future[tuple[str, str]]]
        if known.part_size == session.part_size and len(known.parts) == session.parts:
            digests = [_done(known.parts[number - 1]) for number in numbers]
        else:
            digests = [hashers.submit(digests_of, number) for number in numbers]
        try:
            done = 0
            while done < len(numbers) and not stop.is_set():
                end = done + 1
                digests[done].result()
                while end < len(numbers) and end - done < URL_BATCH and digests[end].done():
                    end += 1
                batch = [(n, digests[i].result()) for i, n in zip(range(done, end), numbers[done:end], strict=True)]
                declared = [
                    {"number": n, "size": self._part_length(session, n), "md5": md5, "crc32": crc}
                    for n, (md5, crc) in batch
                ]
                urls = {u.number: u for u in self._part_urls(session.id, declared).items}
                fetched = time.monotonic()
                for number, (md5, crc) in batch:
                    _offer(ready, _ReadyPart(session, source, number, md5, crc, urls[number], fetched), stop)
                done = end
        finally:
            for future in digests:
                future.cancel()

    def _send_ready(
        self,
        ready: queue.Queue[_ReadyPart | None],
        stop: threading.Event,
        state: UploadState,
        progress: Progress | None,
        before_part: PartHook | None,
    ) -> None:
        while not stop.is_set():
            try:
                entry = ready.get(timeout=0.1)
            except queue.Empty:
                continue
            if entry is None:  # every part is sent or being sent
                return
            self._send_to_store(entry, state, progress, before_part)

    def _send_to_store(
        self, entry: _ReadyPart, state: UploadState, progress: Progress | None, before_part: PartHook | None
    ) -> None:
        session, number, source, md5 = entry.session, entry.number, entry.source, entry.md5
        assert session.id is not None
        length = self._part_length(session, number)
        data = read_part(source, (number - 1) * session.part_size, length)
        url: PartUrl = entry.url
        if time.monotonic() - entry.fetched > url.expires_in * URL_FRESH:  # waited too long: a fresh one
            declared = {"number": number, "size": length, "md5": md5, "crc32": entry.crc32}
            url = self._part_urls(session.id, [declared]).items[0]
        body = before_part(session.sha256, number, data) if before_part else data
        try:
            r = self._store_http().request(url.method, url.url, content=body, headers=url.headers)
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"the object store did not take part {number} of {source}: {exc}") from exc
        if r.status_code >= 300:
            raise StoreUnavailable(
                f"the object store refused part {number} of {source}: HTTP {r.status_code} {r.text[:300]}"
            )
        etag = r.headers.get("etag", "").strip('"')
        if len(etag) == 32 and etag != md5:
            raise DigestMismatch(
                f"part {number} of {source}: the store received bytes with MD5 {etag}, not {md5} "
                "(corrupted on the way, or the file changed); run the put again"
            )
        state.ack(session.sha256, session.id, number)
        if progress:
            progress(length)
