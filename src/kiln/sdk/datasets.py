"""Datasets: versioned, content-addressed file sets. A mixin of ``kiln.Client`` (which supplies the transport).

``put_dataset`` hashes every file (SHA-256), sends the manifest, and uploads only the blobs the server lacks, in
parts, a few at a time: through the API on a local store, straight to the store through presigned URLs on S3.
It is resumable: the server keeps each blob's upload session and the parts it holds, and a small state file
(``~/.kiln/uploads/``, keyed by endpoint, dataset name and manifest hash) records the draft and the parts the
server acknowledged, so running the same ``put`` again after an interruption sends only what is left.

``get_dataset`` downloads every file to a temporary name, checks its size and SHA-256 against the manifest, then
renames it: the hash computed before the upload is verified again after the download (end to end).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from kiln.domain.schemas import (
    DatasetManifest,
    DatasetRemoved,
    DatasetSummary,
    DatasetVersionRead,
    DraftRead,
    PartUrl,
    PartUrls,
    UploadRead,
)
from kiln.errors import BadRequest, DigestMismatch, KilnError, StoreUnavailable

Progress = Callable[[int], None]
# Called with (blob sha256, part number, the part's bytes) before a part is sent; returns the bytes to send.
# For tools and tests (e.g. to stop after some parts, or to corrupt one); the declared hashes are the original's.
PartHook = Callable[[str, int, bytes], bytes]
PART_SHA256_HEADER = "X-Kiln-Part-SHA256"
DEFAULT_WORKERS = 4
# Parts sent straight to S3: in flight at once, and the part size a new session asks for (boto3's defaults are
# 8 MiB parts, 10 threads). Small parts keep every connection busy to the end; the server may answer another size.
PUT_WORKERS = 8
PUT_PART_BYTES = 8 * 1024 * 1024
MAX_PARTS = 10_000
# Presigned part URLs are asked for in batches that double up to this many parts; a URL older than this share of
# its life when its turn comes is asked for again.
URL_BATCH = 64
# Threads computing the parts' MD5s ahead of the senders (hashlib releases the GIL: they run in parallel).
HASHERS = max(1, min(4, os.cpu_count() or 1))
URL_FRESH = 0.8
READ_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, "/"-separated: the path inside the dataset
    source: Path
    size: int


def parse_ref(ref: str) -> tuple[str, int | None]:
    name, at, version = ref.partition("@")
    if not name:
        raise BadRequest(f"dataset reference {ref!r}: NAME or NAME@VERSION")
    if not at:
        return name, None
    if not version.isdigit() or int(version) < 1:
        raise BadRequest(f"dataset reference {ref!r}: the version after @ is a number ≥ 1")
    return name, int(version)


def scan_local(root: Path) -> list[LocalFile]:
    """The regular files of ``root`` (a file or a directory). Symbolic links, hard links and special files are
    refused with the list of them: a dataset holds exactly the bytes it names."""
    info = os.lstat(root)
    if stat.S_ISLNK(info.st_mode):
        raise BadRequest(f"{root} is a symbolic link; give the path it points to")
    if stat.S_ISREG(info.st_mode):
        return [LocalFile(root.name, root, info.st_size)]
    if not stat.S_ISDIR(info.st_mode):
        raise BadRequest(f"{root} is neither a regular file nor a directory")
    files: list[LocalFile] = []
    refused: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                refused.append(f"{(base / name).relative_to(root).as_posix()} (symbolic link to a directory)")
        dirnames[:] = sorted(d for d in dirnames if not (base / d).is_symlink())
        for name in sorted(filenames):
            full = base / name
            rel = full.relative_to(root).as_posix()
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                refused.append(f"{rel} (symbolic link to {os.readlink(full)})")
            elif not stat.S_ISREG(st.st_mode):
                refused.append(f"{rel} (not a regular file)")
            elif st.st_nlink > 1:
                refused.append(f"{rel} (hard link: {st.st_nlink} names for the same file)")
            else:
                files.append(LocalFile(rel, full, st.st_size))
    if refused:
        shown = "; ".join(refused[:10]) + (f"; and {len(refused) - 10} more" if len(refused) > 10 else "")
        raise BadRequest(f"refusing links and special files in {root} (copy the real files in): {shown}")
    if not files:
        raise BadRequest(f"{root} holds no files")
    return files


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def preferred_part_size(size: int) -> int:
    """The part size a new upload of ``size`` bytes asks for: PUT_PART_BYTES, doubled until ≤ MAX_PARTS parts."""
    part = PUT_PART_BYTES
    while -(-size // part) > MAX_PARTS:
        part *= 2
    return part


def manifest_sha256(entries: list[dict[str, Any]]) -> str:
    """The same hash the server computes over (path, size, sha256), sorted by path."""
    text = "".join(f"{e['path']}\t{e['size']}\t{e['sha256']}\n" for e in sorted(entries, key=lambda e: e["path"]))
    return hashlib.sha256(text.encode()).hexdigest()


def _safe_target(dest: Path, rel: str) -> Path:
    """Where a manifest path goes under ``dest``; refuses anything that would leave it (a hostile server)."""
    parts = PurePosixPath(rel).parts
    if (
        not parts
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or any(p in ("", ".", "..") for p in rel.split("/"))
    ):
        raise KilnError(f"refusing to write {rel!r}: not a plain relative path")
    target = dest.joinpath(*parts)
    root = dest.resolve()
    if root not in target.resolve().parents:
        raise KilnError(f"refusing to write outside {dest}: {rel}")
    return target


@dataclass(frozen=True)
class _ReadyPart:
    """A part whose digests (hex MD5 and SHA-256) are known and whose presigned URL is at hand (fetched at
    ``fetched``, time.monotonic)."""

    session: UploadRead
    source: Path
    number: int
    md5: str
    sha256: str
    url: PartUrl
    fetched: float


def _read_part(source: Path, offset: int, length: int) -> bytes:
    """``length`` bytes of ``source`` from ``offset``, read straight into the bytes returned (unbuffered)."""
    with open(source, "rb", buffering=0) as fh:
        fh.seek(offset)
        data = fh.read(length)
        if len(data) < length:  # one read returns at most ~2 GiB
            chunks = [data]
            got = len(data)
            while got < length and (more := fh.read(length - got)):
                chunks.append(more)
                got += len(more)
            data = b"".join(chunks)
    if len(data) != length:
        raise KilnError(f"{source} changed while it was uploaded (it is shorter now); run the put again")
    return data


class UploadState:
    """The small resume file of one ``put``: its draft and the parts the server acknowledged, per blob."""

    def __init__(self, directory: Path, endpoint: str, name: str, manifest: str) -> None:
        key = hashlib.sha256(f"{endpoint}\n{name}\n{manifest}".encode()).hexdigest()[:32]
        self.path = directory / f"{key}.json"
        self.lock = threading.Lock()
        self.data: dict[str, Any] = {"endpoint": endpoint, "name": name, "manifest_sha256": manifest, "blobs": {}}
        try:
            saved = json.loads(self.path.read_text())
            if saved.get("manifest_sha256") == manifest and saved.get("endpoint") == endpoint:
                self.data = saved
        except (OSError, ValueError):
            pass

    @property
    def resumed(self) -> bool:
        return bool(self.data.get("draft_id"))

    def acked(self, sha256: str) -> set[int]:
        return set(self.data["blobs"].get(sha256, {}).get("parts", []))

    def save(self, **changes: Any) -> None:
        with self.lock:
            self.data.update(changes)
            self._write()

    def ack(self, sha256: str, upload_id: str, number: int) -> None:
        with self.lock:
            blob = self.data["blobs"].setdefault(sha256, {"upload_id": upload_id, "parts": []})
            if blob.get("upload_id") != upload_id:
                blob.update(upload_id=upload_id, parts=[])
            blob["parts"] = sorted(set(blob["parts"]) | {number})
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(self.path.name + f".{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def _run_all(pool: ThreadPoolExecutor, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on the pool; on the first failure cancel what has not started and raise it."""
    futures: list[Future[Any]] = [pool.submit(call) for call in calls]
    _done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for future in pending:
        future.cancel()
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            wait(pending)
            raise future.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


class DatasetsMixin:
    """The dataset methods of ``kiln.Client``."""

    if TYPE_CHECKING:
        endpoint: str
        _http: httpx.Client

        def request(
            self,
            method: str,
            path: str,
            *,
            params: dict[str, Any] | None = None,
            json_body: Any = None,
            content: Any = None,
            unsigned: bool = False,
            content_sha256: str | None = None,
            extra_headers: dict[str, str] | None = None,
        ) -> httpx.Response: ...

        def _prepare(
            self,
            method: str,
            path: str,
            params: dict[str, Any] | None,
            body: bytes | None,
            unsigned: bool,
            content_sha256: str | None = None,
        ) -> tuple[str, dict[str, str]]: ...

        @staticmethod
        def _raise_for(response: httpx.Response) -> None: ...

    _store_client: httpx.Client | None = None

    def _store_http(self) -> httpx.Client:
        """A plain client for presigned store URLs: Kiln's signature headers never go to the store."""
        if self._store_client is None:
            limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
            self._store_client = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0), limits=limits)
        return self._store_client

    # -- reads ----------------------------------------------------------------------------------------------

    def datasets(self) -> list[DatasetSummary]:
        return [DatasetSummary.model_validate(d) for d in self.request("GET", "/datasets").json()["items"]]

    def dataset_versions(self, name: str) -> list[DatasetVersionRead]:
        data = self.request("GET", f"/datasets/{quote(name, safe='')}").json()
        return [DatasetVersionRead.model_validate(v) for v in data["items"]]

    def dataset_manifest(self, ref: str) -> DatasetManifest:
        name, version = parse_ref(ref)
        path = f"/datasets/{quote(name, safe='')}/versions/{version or 'latest'}"
        return DatasetManifest.model_validate(self.request("GET", path).json())

    def remove_dataset(self, ref: str) -> DatasetRemoved:
        """``NAME@VERSION``: that version; ``NAME``: every version. Blobs no other version uses are deleted."""
        name, version = parse_ref(ref)
        path = f"/datasets/{quote(name, safe='')}" + (f"/versions/{version}" if version else "")
        return DatasetRemoved.model_validate(self.request("DELETE", path).json())

    # -- upload ---------------------------------------------------------------------------------------------

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
    ) -> DatasetVersionRead:
        """Upload a file or directory as the next version of ``name`` (or return the latest version when it
        already holds exactly these files). ``on_total`` is told the bytes to send, ``progress`` each part sent.
        ``workers``: files hashed and parts in flight at once (default: PUT_WORKERS parts straight to S3,
        DEFAULT_WORKERS otherwise)."""
        files = scan_local(Path(path))
        threads = max(1, workers or DEFAULT_WORKERS)
        with ThreadPoolExecutor(threads, thread_name_prefix="kiln-put") as pool:
            hashes = list(pool.map(lambda f: sha256_file(f.source), files))
            entries = [{"path": f.path, "size": f.size, "sha256": h} for f, h in zip(files, hashes, strict=True)]
            digest = manifest_sha256(entries)
            state = UploadState(state_dir or Path.home() / ".kiln" / "uploads", self.endpoint, name, digest)
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
            if on_total:
                on_total(draft.missing_bytes)
            sessions: list[UploadRead] = _run_all(
                pool,
                [partial(self._open_upload, sha, sources[sha].size) for sha in draft.missing],
            )
            api_parts: list[Callable[[], Any]] = []
            presigned: list[tuple[UploadRead, Path, list[int]]] = []
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
                        presigned.append((session, source, pending))
                else:
                    api_parts += [
                        partial(self._send_part, session, n, source, state, progress, before_part) for n in pending
                    ]
            _run_all(pool, api_parts)
            self._send_presigned(presigned, state, progress, before_part, max(1, workers or PUT_WORKERS))
            open_sessions = [s for s in sessions if not s.complete and s.id is not None]
            _run_all(pool, [partial(self.request, "POST", f"/uploads/{s.id}/complete") for s in open_sessions])
        version = DatasetVersionRead.model_validate(self.request("POST", f"/datasets/drafts/{draft.id}/commit").json())
        state.clear()
        return version

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
        data = _read_part(source, (number - 1) * session.part_size, length)
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

    # Parts straight to S3, as a pipeline: per blob, hashing threads read each part and compute its MD5, and a
    # producer asks the server for presigned URLs in batches (one round trip for up to URL_BATCH parts), ahead of
    # the senders; ``workers`` senders re-read each part (from the page cache) and PUT it to the store on their own
    # connection.

    def _send_presigned(
        self,
        uploads: list[tuple[UploadRead, Path, list[int]]],
        state: UploadState,
        progress: Progress | None,
        before_part: PartHook | None,
        workers: int,
    ) -> None:
        if not uploads:
            return
        self._store_http()  # created once, before the threads share it
        stop = threading.Event()  # a failure anywhere: everyone stops taking new work
        produced = threading.Event()  # every URL is queued
        ready: queue.Queue[_ReadyPart] = queue.Queue(maxsize=max(URL_BATCH, 2 * workers))
        failures: list[BaseException] = []

        def check(future: Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                failures.append(future.exception())  # type: ignore[arg-type]
                stop.set()

        with (
            ThreadPoolExecutor(min(len(uploads), 4), thread_name_prefix="kiln-put-urls") as producers,
            ThreadPoolExecutor(HASHERS, thread_name_prefix="kiln-put-md5") as hashers,
            ThreadPoolExecutor(workers, thread_name_prefix="kiln-put-parts") as senders,
        ):
            made = [
                producers.submit(self._produce_urls, s, src, numbers, ready, stop, hashers)
                for s, src, numbers in uploads
            ]
            sending = [
                senders.submit(self._send_ready, ready, stop, produced, state, progress, before_part)
                for _ in range(workers)
            ]
            for future in made + sending:
                future.add_done_callback(check)
            try:
                wait(made, return_when=ALL_COMPLETED)
                produced.set()
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
        ready: queue.Queue[_ReadyPart],
        stop: threading.Event,
        hashers: ThreadPoolExecutor,
    ) -> None:
        assert session.id is not None

        def digests_of(number: int) -> tuple[str, str]:
            if stop.is_set():
                return "", ""
            length = self._part_length(session, number)
            data = _read_part(source, (number - 1) * session.part_size, length)
            return hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()

        # The digests are computed in order on the hashing threads; URLs are asked for as soon as a part's digests
        # are known, together with every following one already known (at most URL_BATCH): small batches while the
        # hashing is behind the senders, large ones once it is ahead.
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
                    {"number": n, "size": self._part_length(session, n), "md5": md5, "sha256": sha}
                    for n, (md5, sha) in batch
                ]
                urls = {u.number: u for u in self._part_urls(session.id, declared).items}
                fetched = time.monotonic()
                for number, (md5, sha) in batch:
                    entry = _ReadyPart(session, source, number, md5, sha, urls[number], fetched)
                    while not stop.is_set():
                        try:
                            ready.put(entry, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                done = end
        finally:
            for future in digests:
                future.cancel()

    def _send_ready(
        self,
        ready: queue.Queue[_ReadyPart],
        stop: threading.Event,
        produced: threading.Event,
        state: UploadState,
        progress: Progress | None,
        before_part: PartHook | None,
    ) -> None:
        while not stop.is_set():
            try:
                entry = ready.get(timeout=0.1)
            except queue.Empty:
                if produced.is_set() and ready.empty():
                    return
                continue
            self._send_to_store(entry, state, progress, before_part)

    def _send_to_store(
        self, entry: _ReadyPart, state: UploadState, progress: Progress | None, before_part: PartHook | None
    ) -> None:
        session, number, source, md5 = entry.session, entry.number, entry.source, entry.md5
        assert session.id is not None
        length = self._part_length(session, number)
        data = _read_part(source, (number - 1) * session.part_size, length)
        url: PartUrl = entry.url
        if time.monotonic() - entry.fetched > url.expires_in * URL_FRESH:  # waited too long: a fresh one
            declared = {"number": number, "size": length, "md5": md5, "sha256": entry.sha256}
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

    # -- download -------------------------------------------------------------------------------------------

    def get_dataset(
        self,
        ref: str,
        dest: Path | str,
        progress: Progress | None = None,
        *,
        on_total: Callable[[int], None] | None = None,
        workers: int = DEFAULT_WORKERS,
    ) -> DatasetManifest:
        """Download ``NAME[@VERSION]`` (default: the latest) into ``dest``; every file's size and SHA-256 is checked
        before it takes its name (a mismatch raises DigestMismatch and leaves nothing under that name)."""
        manifest = self.dataset_manifest(ref)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        targets = [(entry, _safe_target(dest, entry.path)) for entry in manifest.items]
        if on_total:
            on_total(manifest.size)
        base = f"/datasets/{quote(manifest.name, safe='')}/versions/{manifest.version}/files/"
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="kiln-get") as pool:
            _run_all(
                pool,
                [
                    partial(self._fetch, base + quote(e.path, safe="/"), e.path, e.sha256, e.size, t, progress)
                    for e, t in targets
                ],
            )
        return manifest

    @contextmanager
    def _open_file(self, api_path: str) -> Iterator[httpx.Response]:
        url, headers = self._prepare("GET", api_path, None, b"", False)
        try:
            with self._http.stream("GET", url, headers=headers) as response:
                if response.status_code in (301, 302, 303, 307, 308):
                    location = response.headers["location"]
                    with self._store_http().stream("GET", location) as stored:
                        if stored.status_code >= 300:
                            stored.read()
                            raise StoreUnavailable(
                                f"the object store refused a download: HTTP {stored.status_code} {stored.text[:300]}"
                            )
                        yield stored
                    return
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                yield response
        except httpx.TransportError as exc:
            raise KilnError(f"download of {api_path} failed: {exc}") from exc

    def _fetch(self, api_path: str, rel: str, sha256: str, size: int, target: Path, progress: Progress | None) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.kiln-{secrets.token_hex(4)}")
        digest = hashlib.sha256()
        got = 0
        try:
            with self._open_file(api_path) as response, open(tmp, "wb") as fh:
                for chunk in response.iter_bytes(READ_CHUNK):
                    digest.update(chunk)
                    fh.write(chunk)
                    got += len(chunk)
                    if progress:
                        progress(len(chunk))
            if got != size or digest.hexdigest() != sha256:
                raise DigestMismatch(
                    f"{rel}: downloaded {got} bytes hashing to {digest.hexdigest()}, the manifest says {size} bytes "
                    f"with SHA-256 {sha256}; nothing written under its name"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
