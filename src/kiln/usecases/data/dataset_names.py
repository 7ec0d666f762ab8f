"""What a dataset may be called and hold, and where its bytes live: dataset names and ``NAME[@VERSION]``
references (the grammar is ``kiln.domain.dataset_refs``; here its errors are BadRequest), file paths inside a
version, manifests (validation and their hash) and the content-addressed store key of a blob
(``orgs/<org>/data/sha256/<aa>/<sha256>``). Used by ``kiln.usecases.data.datasets`` and ``kiln.usecases.data.uploads``.
"""

from __future__ import annotations

import bisect
import hashlib
import re

from kiln.domain import dataset_refs
from kiln.domain.dataset_refs import PERCENT_ENCODED
from kiln.domain.datasets import DatasetFileEntry
from kiln.errors import BadRequest

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_PATH = 1024


def validate_name(name: str) -> str:
    """A dataset name (``kiln.domain.dataset_refs``); BadRequest naming the rule it breaks."""
    try:
        return dataset_refs.check_name(name)
    except dataset_refs.DatasetRefError as exc:
        raise BadRequest(str(exc)) from None


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME``, ``NAME@latest`` or ``NAME@VERSION`` → (name, version or None); BadRequest when it is none."""
    try:
        return dataset_refs.parse_ref(ref)
    except dataset_refs.DatasetRefError as exc:
        raise BadRequest(str(exc)) from None


def validate_path(path: str) -> str:
    """A file path inside a dataset: relative, ``/``-separated, no ``.``/``..``/empty segments, no backslash, NUL,
    control characters or percent-encoding. The error names the offending part."""
    if not path:
        raise BadRequest("file path: empty")
    if len(path) > MAX_PATH:
        raise BadRequest(f"file path {path[:60]!r}...: longer than {MAX_PATH} characters")
    if "\x00" in path:
        raise BadRequest(f"file path {path!r}: NUL is not allowed")
    if "\\" in path:
        raise BadRequest(f"file path {path!r}: backslashes are not allowed (use '/')")
    if CONTROL.search(path):
        raise BadRequest(f"file path {path!r}: control characters are not allowed")
    if match := PERCENT_ENCODED.search(path):
        raise BadRequest(f"file path {path!r}: percent-encoded {match.group(0)!r} is not allowed")
    if path.startswith("/"):
        raise BadRequest(f"file path {path!r}: absolute paths are not allowed")
    for index, segment in enumerate(path.split("/"), start=1):
        if segment in (".", ".."):
            raise BadRequest(f"file path {path!r}: segment {index} is {segment!r}, which is not allowed")
        if segment == "":
            raise BadRequest(f"file path {path!r}: segment {index} is empty")
    return path


def validate_manifest(files: list[DatasetFileEntry], max_files: int) -> list[DatasetFileEntry]:
    if not files:
        raise BadRequest("a dataset version needs at least one file")
    if len(files) > max_files:
        raise BadRequest(f"{len(files)} files: a dataset version holds at most {max_files}")
    seen: set[str] = set()
    for entry in files:
        validate_path(entry.path)
        if entry.path in seen:
            raise BadRequest(f"file path {entry.path!r}: listed twice")
        seen.add(entry.path)
    # A path is also a directory when another path starts with it and a '/'. Among the sorted paths, those that
    # start with P + "/" begin where P + "/" would be inserted: one binary search per path, and no string built
    # per directory level (every ancestor of every path, for deep paths, is quadratic in time and memory).
    ordered = sorted(seen)
    clash = None
    for path in ordered:
        below = path + "/"
        at = bisect.bisect_left(ordered, below)
        if at < len(ordered) and ordered[at].startswith(below):
            clash = path
            break
    if clash is not None:
        raise BadRequest(f"file path {clash!r}: is both a file and a directory")
    return sorted(files, key=lambda f: f.path)


def manifest_sha256(files: list[DatasetFileEntry]) -> str:
    text = "".join(f"{f.path}\t{f.size}\t{f.sha256}\n" for f in sorted(files, key=lambda f: f.path))
    return hashlib.sha256(text.encode()).hexdigest()


def data_prefix(org_id: str) -> str:
    """The prefix under which the organisation's dataset blobs live (what a ``mode: mount`` input mounts)."""
    return f"orgs/{org_id}/data/sha256"


def data_key(org_id: str, sha256: str) -> str:
    if not SHA256.fullmatch(sha256):
        raise BadRequest(f"invalid sha256 {sha256!r}")
    return f"{data_prefix(org_id)}/{sha256[:2]}/{sha256}"
