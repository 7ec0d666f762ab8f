"""The log line format, shared by the shim (which cannot import kiln) and the server.

The shim carries its own copy of ``format_line`` as it runs without site-packages; a test keeps the two equal.
"""

from __future__ import annotations

import time


def timestamp(now: float | None = None) -> str:
    now = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def format_line(stream: str, text: bytes, now: float | None = None) -> bytes:
    return timestamp(now).encode() + b" " + stream.encode() + b" " + text.rstrip(b"\n") + b"\n"


def parse_line(line: str) -> tuple[str, str, str]:
    """(time, stream, text) of one stored line; tolerant of malformed lines."""
    time_, stream, _, text = parse_tagged(line)
    return time_, stream, text


def parse_tagged(line: str) -> tuple[str, str, str, str]:
    """(time, stream, member, text): a distributed job's members tag their streams, ``O@worker1``; member is
    "" for an untagged line (a single-worker job, or Kiln's own messages)."""
    parts = line.rstrip("\n").split(" ", 2)
    if len(parts) >= 2:
        stream, _, member = parts[1].partition("@")
        if len(stream) == 1:
            return parts[0], stream, member, parts[2] if len(parts) == 3 else ""
    return "", "O", "", line.rstrip("\n")
