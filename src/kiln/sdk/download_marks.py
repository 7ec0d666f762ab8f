"""Marks on the directories job downloads write to, so that a later ``kiln run`` does not pack a job's outputs
back up as code.

``kiln jobs download JOB --dest out`` (``Client.download``) leaves ``out/.kiln-download``, a small JSON file naming
the job and the files it wrote. Packing skips a marked directory below the code's root whole, and in a marked root
(a download into the code directory itself) the files a download wrote; it says what it left out.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = ".kiln-download"


@dataclass(frozen=True)
class Mark:
    """What a directory's marker says: the job downloaded last, and every file downloads wrote there."""

    job: str
    files: frozenset[str]


def read_mark(directory: Path) -> Mark | None:
    """The mark of ``directory``, or None when it has none. An unreadable marker still marks the directory."""
    path = directory / MARKER
    if not path.is_file():
        return None
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return Mark("an earlier download", frozenset())
    if not isinstance(data, dict):
        return Mark("an earlier download", frozenset())
    files = data.get("files")
    return Mark(
        str(data.get("job") or "an earlier download"),
        frozenset(f for f in files if isinstance(f, str)) if isinstance(files, list) else frozenset(),
    )


def mark_download(dest: Path, job_id: str, written: list[Path]) -> None:
    """Record in ``dest`` that a download of ``job_id`` wrote ``written`` there (added to what earlier downloads
    wrote). Best effort: a destination that cannot take the marker does not fail the download."""
    if not written:
        return  # nothing came: the directory is not (yet) a download's
    root = dest.resolve()
    earlier = read_mark(dest)
    files = set(earlier.files) if earlier else set()
    for path in written:
        try:
            files.add(path.resolve().relative_to(root).as_posix())
        except ValueError:
            continue
    body = json.dumps(
        {"job": job_id, "files": sorted(files), "note": "written by `kiln jobs download`; `kiln run` skips this"}
    )
    tmp = dest / f"{MARKER}.{secrets.token_hex(4)}.tmp"
    try:
        tmp.write_text(body + "\n")
        os.replace(tmp, dest / MARKER)
    except OSError:
        tmp.unlink(missing_ok=True)
