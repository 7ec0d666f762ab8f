"""Copying files and trees while hashing them, for backups (kiln.usecases.operations.backup): each byte is read once,
the
SHA-256 computed on the buffer that is written, so a copy costs one read and one write of each file."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BUFFER = 4 * 1024 * 1024  # hashlib and the kernel both release the GIL on buffers this large


@dataclass(frozen=True)
class Copied:
    """One file of a backup: its path relative to the backup's root (``/``-separated), size and SHA-256."""

    path: str
    size: int
    sha256: str

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


def copy_hashed(src: Path, dest: Path) -> tuple[int, str]:
    """Copy ``src`` to ``dest`` (its permission bits too) and return (size, SHA-256) of what was copied. A file
    that grows meanwhile (a running job's log) is copied up to where the copy's reads ended."""
    digest = hashlib.sha256()
    size = 0
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb", buffering=0) as fin, open(dest, "wb", buffering=0) as fout:
        os.fchmod(fout.fileno(), stat.S_IMODE(os.fstat(fin.fileno()).st_mode) | stat.S_IRUSR | stat.S_IWUSR)
        while n := fin.readinto(buf):
            chunk = view[:n]
            digest.update(chunk)
            written = 0
            while written < n:
                written += fout.write(chunk[written:]) or 0
            size += n
    return size, digest.hexdigest()


def walk_files(root: Path, skip: Callable[[str], bool] = lambda name: False) -> list[Path]:
    """Every regular file under ``root`` (links are not followed, nor copied: Kiln's state holds none), sorted."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if skip(name) or path.is_symlink():
                continue
            found.append(path)
    return found


def copy_tree(
    src: Path, dest: Path, prefix: str, skip: Callable[[str], bool] = lambda name: False
) -> tuple[list[Copied], list[str]]:
    """Copy every regular file under ``src`` to ``dest``; (the files copied, named ``prefix/relative path``, and
    the relative paths that vanished between the listing and their copy: a live store removes objects)."""
    copied: list[Copied] = []
    vanished: list[str] = []
    if not src.is_dir():
        return copied, vanished
    for path in walk_files(src, skip):
        rel = path.relative_to(src).as_posix()
        try:
            size, sha = copy_hashed(path, dest / rel)
        except FileNotFoundError:
            vanished.append(rel)
            (dest / rel).unlink(missing_ok=True)
            continue
        copied.append(Copied(f"{prefix}/{rel}", size, sha))
    return copied, vanished


def fsync_tree(root: Path) -> None:
    """Make a finished copy durable: every file and directory under ``root`` synced (before it is renamed into
    place, so a crash leaves the old state or the whole new one)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
