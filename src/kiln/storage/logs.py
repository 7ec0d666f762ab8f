"""The job log store: one append-only file per job on the server that writes it, and its copy in the object store,
which every server reads.

Each line is ``<RFC 3339 UTC time> <stream> <text>``, stream being ``O`` (stdout), ``E`` (stderr) or ``K``
(a message from Kiln itself, e.g. restarts). Logs outlive jobs and server restarts.

The server that holds a job's lease writes its log here (the shim writes the local file directly) and ships what
it wrote to the store (``ship``): every few seconds while the job runs (kiln.tasks.log_shipping) and before an
attempt's end is recorded (the reconciler). The store's copy is a few **segments** under
``orgs/<org>/jobs/<job>/log/`` named by the offset of their first byte in the log: shipping rewrites the last
segment with what it had plus the new bytes while that segment is under ``SEGMENT_BYTES``, else starts a new one,
so a log is about ``size / SEGMENT_BYTES`` objects and a round uploads at most one segment's worth again. Every
byte has one offset whichever copy holds it, so a reader takes it from the local file where that has it, else from
the store: through any server a job's log reads the same, up to what its writer has shipped. A server that takes
up a job whose log it lacks (a restart on another machine) first copies the store's segments into its own file
(``catch_up``), so that the offsets it writes at go on where the store's copy ends.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.errors import NotFound
from kiln.storage.keys import log_prefix
from kiln.storage.store import ObjectStore, safe_key

SEGMENT_BYTES = 4 * 1024 * 1024  # the last segment is rewritten while it is smaller (see the module's note)
SHIP_BYTES = 64 * 1024 * 1024  # at most this much is read into memory for one upload


def _whole_lines(data: bytes, limit: int) -> bytes:
    """The whole lines of ``data``; a line longer than ``limit`` comes in pieces of ``limit`` bytes."""
    cut = data.rfind(b"\n")
    if cut < 0:
        return data if len(data) >= limit else b""
    return data[: cut + 1]


class LogStore:
    def __init__(self, root: Path, store: ObjectStore | None = None) -> None:
        """``store``: where logs are shipped and read from when this server's file lacks them (None: only the
        files under ``root``, a single server's logs)."""
        self.root = root
        self.store = store
        root.mkdir(parents=True, exist_ok=True)
        # (org, job) whose last ship failed (a store that is down): kiln.tasks.log_shipping tries them again.
        self.unshipped: set[tuple[str, str]] = set()

    def path(self, job_id: str) -> Path:
        return self.root / f"{safe_key(job_id)}.log"

    def size(self, job_id: str) -> int:
        try:
            return self.path(job_id).stat().st_size
        except FileNotFoundError:
            return 0

    def read(
        self, job_id: str, offset: int = 0, limit: int = 1024 * 1024, org_id: str | None = None
    ) -> tuple[bytes, int]:
        """Whole lines from ``offset`` (at most ``limit`` bytes unless one line is longer); next offset. With
        ``org_id``, bytes this server's file does not have are read from the store's copy."""
        data, next_offset = self._read_local(job_id, offset, limit)
        if data or org_id is None or self.store is None or self.size(job_id) > offset:
            return data, next_offset
        return self._read_shipped(org_id, job_id, offset, limit)

    def _read_local(self, job_id: str, offset: int, limit: int) -> tuple[bytes, int]:
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
        # A partial line: wait for its end unless the buffer is full.
        data = _whole_lines(data, limit)
        return data, offset + len(data)

    # -- the store's copy -----------------------------------------------------------------------------------

    def segments(self, org_id: str, job_id: str) -> list[tuple[int, int]]:
        """(first offset, size) of each shipped segment, in order."""
        if self.store is None:
            return []
        out = []
        for name, size in self.store.list(log_prefix(org_id, job_id)):
            if name.isdigit():
                out.append((int(name), size))
        return sorted(out)

    def shipped(self, org_id: str, job_id: str) -> int:
        """How many bytes of the log the store holds."""
        return max((start + size for start, size in self.segments(org_id, job_id)), default=0)

    def _read_shipped(self, org_id: str, job_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        assert self.store is not None
        for _ in range(3):  # a segment rewritten between the listing and the read: list again
            found = [(s, n) for s, n in self.segments(org_id, job_id) if s <= offset < s + n]
            if not found:
                return b"", offset
            start, size = found[0]
            try:
                with self.store.open(f"{log_prefix(org_id, job_id)}/{start:016d}") as fh:
                    fh.seek(offset - start)
                    data = fh.read(min(limit, size - (offset - start)))
            except NotFound:
                continue
            # A segment ends at the end of a line, or where the log ends (its writer's last, unended line).
            if offset + len(data) < start + size:
                data = _whole_lines(data, limit)
            return data, offset + len(data)
        return b"", offset

    def ship(self, org_id: str, job_id: str, *, final: bool = False, source: Path | None = None) -> int:
        """Copy to the store what it lacks of this server's file of the job's log (whole lines, and with
        ``final`` the unended last one too: the attempt is over). Returns how many bytes the store then holds
        (the log's size as every server sees it). Only the server writing the log ships it. ``source``: the
        file the attempt wrote, where that is not this server's (an attempt another server on this machine
        started, which this one adopted: the path its handle records)."""
        path = source or self.path(job_id)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if self.store is None:
            return size
        segments = self.segments(org_id, job_id)
        end = max((start + size for start, size in segments), default=0)
        while size > end:
            # Rewrite the last segment while it is small, else start one where the store's copy ends.
            last = segments[-1] if segments else None
            start = last[0] if last is not None and last[1] < SEGMENT_BYTES else end
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read(min(size - start, max(SHIP_BYTES, end - start + 1)))
            if not (final and start + len(data) == size):
                data = _whole_lines(data, SHIP_BYTES)
            if start + len(data) <= end:
                break  # no new whole line yet
            self.store.put_objects([(f"{log_prefix(org_id, job_id)}/{start:016d}", data)])
            segments = [*(segments[:-1] if start != end else segments), (start, len(data))]
            end = start + len(data)
        return end

    def catch_up(self, org_id: str, job_id: str) -> None:
        """Before this server writes to a job's log: copy into its file what the store holds beyond it (the
        log of attempts that ran elsewhere), so that what it appends lands after them."""
        if self.store is None:
            return
        have = self.size(job_id)
        with open(self.path(job_id), "ab") as fh:
            for start, size in self.segments(org_id, job_id):
                if start + size <= have:
                    continue
                with self.store.open(f"{log_prefix(org_id, job_id)}/{start:016d}") as src:
                    src.seek(have - start)
                    while chunk := src.read(1024 * 1024):
                        fh.write(chunk)
                        have += len(chunk)

    def remove(self, org_id: str, job_id: str) -> None:
        """The job's log, here and in the store."""
        self.path(job_id).unlink(missing_ok=True)
        if self.store is not None:
            for start, _ in self.segments(org_id, job_id):
                self.store.delete(f"{log_prefix(org_id, job_id)}/{start:016d}")
        self.unshipped.discard((org_id, job_id))

    # -- writing --------------------------------------------------------------------------------------------

    def append(self, job_id: str, stream: str, lines: list[str]) -> None:
        """Lines that arrive through the API (a job on another machine reporting its output)."""
        from kiln.injob.logline import format_line

        data = b"".join(format_line(stream, line.encode()) for line in lines)
        with open(self.path(job_id), "ab") as fh:
            fh.write(data)

    def append_system(self, job_id: str, line: str, source: Path | None = None) -> None:
        """A line from Kiln itself; best effort (a full disk must not stop the reconciler). ``source``: the file
        the attempt writes, where that is not this server's (see ``ship``)."""
        from kiln.injob.logline import format_line

        try:
            with open(source or self.path(job_id), "ab") as fh:
                fh.write(format_line("K", line.encode()))
        except OSError:
            pass
