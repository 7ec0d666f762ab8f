"""Reading a job's spool files as the ingester does (kiln.tasks.metrics_ingest): never through a link, in pieces
of whole lines."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from kiln.metrics.parse import Parsed


def long_line_parsed(line: int) -> Parsed:
    parsed = Parsed()
    parsed.error(f"a line over {line} bytes (metrics.limits.line)")
    parsed.long_lines = 1
    return parsed


def piece_of(chunk: bytes, start: int, size: int) -> bytes:
    """The complete lines of ``chunk`` from ``start`` up to the first newline at least ``size`` bytes on (or its
    end): a batch is cut near its bounds however many points a slice of a file holds."""
    end = chunk.find(b"\n", min(start + size, len(chunk)) - 1) + 1 or len(chunk)
    return chunk[start:end]


def open_spool(path: Path) -> BinaryIO:
    """A job's spool file, never through a link the job left in its metrics dir (the server reads as itself)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def has_newline(path: Path, offset: int) -> bool:
    try:
        with open_spool(path) as fh:
            fh.seek(offset)
            while block := fh.read(1024 * 1024):
                if b"\n" in block:
                    return True
    except OSError:
        return False
    return False
