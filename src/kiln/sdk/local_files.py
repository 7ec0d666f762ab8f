"""The local side of dataset transfers: the files of a dataset on disk (scanned, refusing links and special files),
their SHA-256 and the manifest hash, parts read from a file, where a downloaded file may go, and the resume file of
an upload (``UploadState``, under ``uploads/`` in ``kiln.sdk.config.client_dir()``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import threading
import zlib
from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from kiln.errors import BadRequest, KilnError

READ_CHUNK = 4 * 1024 * 1024
# Parts read ahead of their digests while a file is hashed (memory: this many parts).
PART_DIGESTS_AHEAD = 4


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, "/"-separated: the path inside the dataset
    source: Path
    size: int


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
    return hash_file(path).sha256


@dataclass(frozen=True)
class FileDigests:
    """A file's SHA-256 and, when asked for, the hex MD5 and CRC32 of each of its parts of ``part_size`` bytes
    (what a part sent straight to S3 declares), all from one read of the file."""

    sha256: str
    part_size: int | None = None
    parts: tuple[tuple[str, str], ...] = ()


def part_digests(data: bytes) -> tuple[str, str]:
    """A part's hex MD5 and its CRC32 as 8 hex digits (big-endian, as S3's flexible checksum)."""
    return hashlib.md5(data).hexdigest(), format(zlib.crc32(data), "08x")


def hash_file(path: Path, part_size: int | None = None, pool: Executor | None = None) -> FileDigests:
    """The file's SHA-256, and with ``part_size`` its parts' digests, computed on ``pool`` (when given) while this
    thread goes on reading and hashing the whole: hashlib releases the GIL, so both run at once. At most
    PART_DIGESTS_AHEAD parts are held in memory waiting for their digests."""
    digest = hashlib.sha256()
    if not part_size:
        with open(path, "rb") as fh:
            while chunk := fh.read(READ_CHUNK):
                digest.update(chunk)
        return FileDigests(digest.hexdigest())
    parts: list[tuple[str, str]] = []
    waiting: deque[Future[tuple[str, str]]] = deque()
    with open(path, "rb", buffering=0) as fh:
        while data := _read_up_to(fh, part_size):
            if pool is None:
                parts.append(part_digests(data))
            else:
                waiting.append(pool.submit(part_digests, data))
                while len(waiting) > PART_DIGESTS_AHEAD:
                    parts.append(waiting.popleft().result())
            digest.update(data)
    parts += [future.result() for future in waiting]
    return FileDigests(digest.hexdigest(), part_size, tuple(parts))


def _read_up_to(fh: BinaryIO, length: int) -> bytes:
    """``length`` bytes from ``fh``, fewer only at the end of the file (one raw read returns at most ~2 GiB)."""
    data = fh.read(length)
    if data and len(data) < length:
        chunks = [data]
        got = len(data)
        while got < length and (more := fh.read(length - got)):
            chunks.append(more)
            got += len(more)
        data = b"".join(chunks)
    return data


def manifest_sha256(entries: list[dict[str, Any]]) -> str:
    """The same hash the server computes over (path, size, sha256), sorted by path."""
    text = "".join(f"{e['path']}\t{e['size']}\t{e['sha256']}\n" for e in sorted(entries, key=lambda e: e["path"]))
    return hashlib.sha256(text.encode()).hexdigest()


def safe_target(dest: Path, rel: str) -> Path:
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


def read_part(source: Path, offset: int, length: int) -> bytes:
    """``length`` bytes of ``source`` from ``offset``, read straight into the bytes returned (unbuffered)."""
    with open(source, "rb", buffering=0) as fh:
        fh.seek(offset)
        data = _read_up_to(fh, length)
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
