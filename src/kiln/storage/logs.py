"""The job log store: one append-only file per job, written by the executor, read by the API.

Each line is ``<RFC 3339 UTC time> <stream> <text>``, stream being ``O`` (stdout), ``E`` (stderr) or ``K``
(a message from Kiln itself, e.g. restarts). Logs outlive jobs and server restarts.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.storage.store import safe_key


class LogStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str) -> Path:
        return self.root / f"{safe_key(job_id)}.log"

    def size(self, job_id: str) -> int:
        try:
            return self.path(job_id).stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, job_id: str, offset: int = 0, limit: int = 1024 * 1024) -> tuple[bytes, int]:
        """Whole lines from ``offset`` (at most ``limit`` bytes unless one line is longer); next offset."""
        try:
            fd = os.open(self.path(job_id), os.O_RDONLY)
        except FileNotFoundError:
            return b"", offset
        try:
            # Past the end there is nothing yet; and seeking there can fail (ext4 refuses offsets past 16 TiB).
            if offset >= os.fstat(fd).st_size:
                return b"", offset
            os.lseek(fd, offset, os.SEEK_SET)
            data = os.read(fd, limit)
        finally:
            os.close(fd)
        if not data:
            return b"", offset
        cut = data.rfind(b"\n")
        if cut < 0:
            # A partial line: wait for its end unless the buffer is full.
            return (data, offset + len(data)) if len(data) >= limit else (b"", offset)
        data = data[: cut + 1]
        return data, offset + len(data)

    def append(self, job_id: str, stream: str, lines: list[str]) -> None:
        """Lines that arrive through the API (a job on another machine reporting its output)."""
        from kiln.runtime.logline import format_line

        data = b"".join(format_line(stream, line.encode()) for line in lines)
        with open(self.path(job_id), "ab") as fh:
            fh.write(data)

    def append_system(self, job_id: str, line: str) -> None:
        """A line from Kiln itself; best effort (a full disk must not stop the reconciler)."""
        from kiln.runtime.logline import format_line

        try:
            with open(self.path(job_id), "ab") as fh:
                fh.write(format_line("K", line.encode()))
        except OSError:
            pass
