"""The artifact store: one interface over any fsspec filesystem (a local directory by default).

Keys are ``/``-separated relative paths; every key is checked so no caller can leave the store's root.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

import fsspec

from kiln.errors import BadRequest, NotFound


def safe_key(*parts: str) -> str:
    """Join key parts, refusing anything that could leave the prefix it is placed under."""
    out: list[str] = []
    for part in parts:
        if "\x00" in part or "\\" in part:
            raise BadRequest(f"invalid path: {part!r}")
        for piece in PurePosixPath(part).parts:
            if piece in ("/", "") or piece.startswith("/"):
                raise BadRequest(f"absolute paths are not allowed: {part!r}")
            if piece in (".", ".."):
                raise BadRequest(f"'.' and '..' are not allowed in paths: {part!r}")
            out.append(piece)
    if not out:
        raise BadRequest("empty path")
    return "/".join(out)


class ObjectStore:
    """Objects under a root URL: a local directory path or any ``protocol://`` fsspec understands."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url, **storage_options)
        self.root = root.rstrip("/")
        self.is_local = self.fs.protocol in ("file", ("file", "local")) or "file" in self.fs.protocol
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> str:
        return f"{self.root}/{safe_key(key)}"

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self._path(key)))

    def size(self, key: str) -> int:
        try:
            return int(self.fs.size(self._path(key)))
        except FileNotFoundError as exc:
            raise NotFound(f"no such object: {key}") from exc

    def put_file(self, local: Path, key: str) -> None:
        """Upload a local file; on a local store the object appears atomically (rename)."""
        path = self._path(key)
        if self.is_local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=".upload-")
            os.close(fd)
            try:
                shutil.copyfile(local, tmp)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        else:
            self.fs.put_file(str(local), path)

    def put_tree(self, local_dir: Path, prefix: str) -> tuple[int, int]:
        """Upload every regular file under ``local_dir`` (links are not followed). Returns (files, bytes)."""
        count = 0
        size = 0
        for dirpath, dirnames, filenames in os.walk(local_dir, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_symlink() or not full.is_file():
                    continue
                rel = full.relative_to(local_dir).as_posix()
                self.put_file(full, f"{prefix}/{rel}")
                count += 1
                size += full.stat().st_size
        return count, size

    def open(self, key: str) -> IO[bytes]:
        try:
            return self.fs.open(self._path(key), "rb")  # type: ignore[no-any-return]
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise NotFound(f"no such object: {key}") from exc

    def iter_bytes(self, key: str, chunk: int = 1024 * 1024) -> Iterator[bytes]:
        with self.open(key) as fh:
            while data := fh.read(chunk):
                yield data

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(path relative to prefix, size) of every object under ``prefix``, sorted."""
        base = self._path(prefix)
        if not self.fs.exists(base):
            return []
        out = []
        for path, info in self.fs.find(base, detail=True).items():
            if info.get("type") == "directory":
                continue
            rel = path[len(base) :].lstrip("/") if path.startswith(base) else path
            if self.is_local:
                rel = os.path.relpath(path, base).replace(os.sep, "/")
            out.append((rel, int(info.get("size") or 0)))
        return sorted(out)

    def local_path(self, key: str) -> Path | None:
        """The object's path on this machine when the store is a local directory, else None."""
        return Path(self._path(key)) if self.is_local else None

    def download(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        self.fs.get_file(self._path(key), str(tmp))
        os.replace(tmp, dest)
