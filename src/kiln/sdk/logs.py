"""A job's log as records: what ``Client.stream_logs`` yields, and what ``kiln logs`` prints.

The server stores and serves lines ``<RFC 3339 time> <O|E|K>[@member] <text>`` (``kiln.injob.logline``): ``O``
and ``E`` are the job's stdout and stderr, ``K`` Kiln's own messages; a distributed job's members tag theirs
(``O@worker1``). ``LogParser`` turns each line into a ``LogLine``, and follows the ``attempt N starting`` lines
Kiln writes so that every record knows its attempt once the log has said it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from kiln.injob.logline import parse_tagged

_STREAMS = {"O": "stdout", "E": "stderr", "K": "kiln"}
# "attempt 2 starting" (the shim, first thing in an attempt), "attempt 1 failed (...); restarting" (the server).
_ATTEMPT = re.compile(r"^attempt (\d{1,9})\b")


class LogSource(StrEnum):
    """Where a line came from: the job's stdout or stderr, or Kiln itself (starts, restarts, limits)."""

    STDOUT = "stdout"
    STDERR = "stderr"
    KILN = "kiln"


def member_label(worker: str) -> str:
    """``worker1`` → ``worker 1``, ``ps0`` → ``ps 0``: how a member is named in front of its lines."""
    role = worker.rstrip("0123456789")
    return f"{role} {worker[len(role) :]}" if role != worker else worker


@dataclass(frozen=True)
class LogLine:
    """One line of a job's log.

    ``time``: when it was logged (UTC; None for a line stored without one); ``source``: stdout, stderr or kiln;
    ``worker``: the member of a distributed job that wrote it (``worker0``, ``worker1``, ``ps0``; None for a
    single-worker job and for the server's own messages about the whole job); ``attempt``: the attempt it belongs
    to, where the log has said so (None when reading started after that attempt's first line); ``text``: the
    line itself, without its newline.

    ``str(line)`` is the line as a person reads it: the text, after ``[worker 1] `` for a member and ``[kiln] ``
    for Kiln's own messages.
    """

    time: datetime | None
    source: LogSource
    text: str
    worker: str | None = None
    attempt: int | None = None

    def __str__(self) -> str:
        return self.prefix() + self.text

    def prefix(self, *, worker: bool = True) -> str:
        """``[worker 1] [kiln] `` as far as it applies; ``worker=False`` leaves the member out (a view of one)."""
        prefix = f"[{member_label(self.worker)}] " if worker and self.worker else ""
        return prefix + ("[kiln] " if self.source is LogSource.KILN else "")


def parse_time(text: str) -> datetime | None:
    """``2026-11-30T12:00:00.250000Z`` → an aware UTC datetime; None for anything else."""
    if not text.endswith("Z"):
        return None
    try:
        return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)
    except ValueError:
        return None


class LogParser:
    """Stored log lines → ``LogLine`` records, in order. Keeps the attempt each member is in: an
    ``attempt N starting`` line from Kiln starts attempt N for its member (for every line of a single-worker job)."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}  # member ("" for an untagged line) → its current attempt

    def parse(self, raw: str) -> LogLine:
        stamp, stream, member, text = parse_tagged(raw)
        source = LogSource(_STREAMS.get(stream, "stdout"))
        attempt = self.attempts.get(member)
        if source is LogSource.KILN:
            said = _ATTEMPT.match(text)
            if said:
                attempt = int(said.group(1))
                if text.endswith(" starting"):
                    self.attempts[member] = attempt
            elif not member and self.attempts:
                attempt = max(self.attempts.values())  # the server's word on the whole job: its latest attempt
        return LogLine(parse_time(stamp), source, text, member or None, attempt)
