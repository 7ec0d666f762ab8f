"""The client's cache of file hashes (``hashes.sqlite`` in the client's state directory,
``kiln.sdk.config.client_dir()``): a ``put`` of files that did not change since the last one does not read them
again.

A file's digests are reused only when its device, inode, size, modification and change times are all as they
were when it was hashed, and when both times were already more than RACY_SECONDS old then: a file written in the
same instant as it was hashed (and possibly written again in that instant, unseen by a coarse clock) is hashed
again next time, as git does with its index. ``kiln data put --rehash`` ignores the cache.

Standard library only (sqlite3); one connection shared by the hashing threads behind a lock. A cache that cannot
be opened or written is skipped, never an error: it only saves time.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kiln.sdk.local_files import FileDigests

log = logging.getLogger(__name__)

# Computes a file's digests: (file, part size or None) -> FileDigests.
HashFn = Callable[[Path, int | None], FileDigests]
RACY_SECONDS = 2
MAX_ENTRIES = 1_000_000  # beyond it, the entries hashed longest ago go

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    hashed_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    part_size INTEGER,
    parts TEXT NOT NULL
)
"""


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class HashCache:
    """Digests of local files by path, valid while the file's identity and times are unchanged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(path, timeout=5, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(SCHEMA)
            self.db = db
        except (OSError, sqlite3.Error) as exc:
            log.warning("hash cache %s not used: %s", path, exc)

    def close(self) -> None:
        if self.db is not None:
            with self.lock:
                self.db.close()
                self.db = None

    def get(self, source: Path, part_size: int | None) -> FileDigests | None:
        """The file's digests as last computed (with part digests of ``part_size`` when asked for), or None."""
        if self.db is None:
            return None
        try:
            key = str(source.resolve())
            st = os.stat(source)
            with self.lock:
                row = self.db.execute(
                    "SELECT dev, ino, size, mtime_ns, ctime_ns, hashed_ns, sha256, part_size, parts FROM files "
                    "WHERE path = ?",
                    (key,),
                ).fetchone()
        except (OSError, sqlite3.Error):
            return None
        if row is None or tuple(row[:5]) != _identity(st):
            return None
        hashed_ns, sha256, cached_part_size, parts = row[5:]
        settled = hashed_ns - RACY_SECONDS * 1_000_000_000
        if st.st_mtime_ns >= settled or st.st_ctime_ns >= settled:
            return None
        if part_size is None:
            return FileDigests(sha256)
        if cached_part_size != part_size:
            return None
        return FileDigests(sha256, part_size, tuple((str(md5), str(crc)) for md5, crc in json.loads(parts)))

    def put(self, source: Path, before: os.stat_result, started_ns: int, digests: FileDigests) -> None:
        """Remember ``digests``, computed from ``started_ns`` on, unless the file changed while it was read
        (``before``: its stat when the reading began)."""
        if self.db is None:
            return
        try:
            after = os.stat(source)
            if _identity(after) != _identity(before):
                return
            row = (
                str(source.resolve()),
                *_identity(after),
                started_ns,
                digests.sha256,
                digests.part_size,
                json.dumps(digests.parts),
            )
            with self.lock:
                self.db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        except (OSError, sqlite3.Error) as exc:
            log.warning("hash cache %s not updated: %s", self.path, exc)

    def trim(self) -> None:
        """Keep at most MAX_ENTRIES entries (the ones hashed last)."""
        if self.db is None:
            return
        try:
            with self.lock:
                (count,) = self.db.execute("SELECT count(*) FROM files").fetchone()
                if count > MAX_ENTRIES:
                    self.db.execute(
                        "DELETE FROM files WHERE path IN (SELECT path FROM files ORDER BY hashed_ns LIMIT ?)",
                        (count - MAX_ENTRIES,),
                    )
        except sqlite3.Error as exc:
            log.warning("hash cache %s not trimmed: %s", self.path, exc)


def hash_cached(
    cache: HashCache | None,
    source: Path,
    part_size: int | None,
    compute: HashFn,
) -> FileDigests:
    """The file's digests from ``cache`` when still valid, else computed by ``compute`` (and remembered)."""
    if cache is None:
        return compute(source, part_size)
    found = cache.get(source, part_size)
    if found is not None:
        return found
    before = os.stat(source)
    started = time.time_ns()
    digests = compute(source, part_size)
    cache.put(source, before, started, digests)
    return digests
