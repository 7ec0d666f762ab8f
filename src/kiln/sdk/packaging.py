"""Packaging a working directory into a code bundle: a deterministic tar.gz that honours ``.gitignore``
(at every level) and ``.kilnignore``, so the same tree always hashes the same and uploads once. What a job
download wrote (``kiln.sdk.download_marks``) is left out, and said so."""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pathspec

from kiln.domain.quantities import format_memory
from kiln.errors import InvalidInput
from kiln.sdk.download_marks import MARKER, read_mark

ALWAYS_IGNORED = [".git/", ".kiln/", "__pycache__/", "*.pyc", ".venv/", ".mypy_cache/", ".pytest_cache/", MARKER]
IGNORE_FILES = (".gitignore", ".kilnignore")
DEFAULT_MAX_CODE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Skipped:
    """Files left out of a bundle because a job download wrote them: a whole directory (``files`` None), or
    in the root itself, the files named (a download into the code directory)."""

    directory: Path  # relative to the root; Path(".") for the root
    job: str
    files: int | None = None

    def describe(self) -> str:
        if self.files is None:
            where = self.directory.as_posix()
            return (
                f"skipped {where}/: a `kiln jobs download` destination ({self.job}; delete {where}/{MARKER} to pack it)"
            )
        return f"skipped {self.files} file(s) that `kiln jobs download` wrote into the code directory ({self.job})"


@dataclass(frozen=True)
class Collected:
    files: list[Path]
    skipped: list[Skipped] = field(default_factory=list)


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str
    size: int
    files: int
    unpacked_bytes: int
    skipped: list[Skipped] = field(default_factory=list)
    # The SHA-256 of each regular file (a link: of its target path), by "/"-separated path: what changed since
    # an earlier bundle of the same directory.
    digests: dict[str, str] = field(default_factory=dict)


class _HashingReader:
    """A file read through this is hashed as tarfile copies it: one read for the bundle and the digest."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.digest.update(data)
        return data


def _spec_for(directory: Path) -> pathspec.PathSpec | None:
    lines: list[str] = []
    for name in IGNORE_FILES:
        f = directory / name
        if f.is_file():
            lines.extend(f.read_text(errors="replace").splitlines())
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


def collect_files(root: Path) -> list[Path]:
    """Relative paths of the files (and in-tree links) to bundle, sorted."""
    return collect(root).files


def collect(root: Path) -> Collected:
    """The files (and in-tree links) to bundle, sorted, and what job downloads put there that is left out."""
    root = root.resolve()
    skipped: list[Skipped] = []
    root_mark = read_mark(root)
    downloaded = root_mark.files if root_mark else frozenset()
    always = pathspec.GitIgnoreSpec.from_lines(ALWAYS_IGNORED)
    specs: list[tuple[Path, pathspec.PathSpec]] = []
    out: list[Path] = []
    dropped = 0

    def ignored(rel: Path, is_dir: bool) -> bool:
        # As git does: ignore files from the root down, the last pattern that matches decides (so a deeper
        # `!keep.log` re-includes what a shallower `*.log` ignored).
        if always.match_file(rel.as_posix() + ("/" if is_dir else "")):
            return True  # no ignore file can bring .git/ or caches back
        verdict: bool | None = None
        for base, spec in specs:
            if base != Path(".") and base not in rel.parents:
                continue
            sub = rel.relative_to(base).as_posix() + ("/" if is_dir else "")
            result = spec.check_file(sub).include
            if result is not None:
                verdict = result
        return bool(verdict)

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(root)
        spec = _spec_for(here)
        if spec is not None:
            specs.append((rel_dir, spec))
        keep = []
        for d in sorted(dirnames):
            rel = rel_dir / d
            full = here / d
            if full.is_symlink():
                filenames.append(d)  # a link to a directory is bundled as a link
                continue
            if ignored(rel, True):
                continue
            mark = read_mark(full)
            if mark is not None:
                skipped.append(Skipped(rel, mark.job))
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = rel_dir / name
            full = here / name
            if ignored(rel, False):
                continue
            if rel.as_posix() in downloaded:
                dropped += 1
                continue
            if full.is_symlink():
                target = (full.parent / os.readlink(full)).resolve()
                if root not in target.parents and target != root:
                    continue  # a link leaving the tree would be refused by the server; leave it out
            elif not full.is_file():
                continue
            out.append(rel)
    if root_mark is not None and dropped:
        skipped.insert(0, Skipped(Path("."), root_mark.job, dropped))
    return Collected(sorted(out), sorted(skipped, key=lambda s: s.directory))


def build_bundle(root: Path, max_bytes: int) -> Bundle:
    """Write the bundle to a temporary file; the caller deletes ``bundle.path``."""
    root = root.resolve()
    if not root.is_dir():
        raise InvalidInput(f"not a directory: {root}")
    collected = collect(root)
    files = collected.files
    sizes = {f: (root / f).lstat().st_size for f in files}
    total = sum(sizes.values())
    if total > max_bytes:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
        listing = ", ".join(f"{p} ({format_memory(n)})" for p, n in biggest)
        raise InvalidInput(
            f"the code in {root} is {format_memory(total)}, over the {format_memory(max_bytes)} limit; "
            f"largest: {listing}. Exclude data and outputs with .kilnignore or .gitignore."
        )
    fd, name = tempfile.mkstemp(prefix="kiln-bundle-", suffix=".tar.gz")
    os.close(fd)
    path = Path(name)
    digests: dict[str, str] = {}
    try:
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for rel in files:
                full = root / rel
                info = tar.gettarinfo(str(full), arcname=rel.as_posix())
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o755 if info.mode & 0o111 else 0o644
                if info.isreg():
                    with open(full, "rb") as fh:
                        reader = _HashingReader(fh)
                        tar.addfile(info, reader)  # type: ignore[arg-type]  # tarfile reads it with read(n)
                    digests[info.name] = reader.digest.hexdigest()
                else:
                    tar.addfile(info)
                    digests[info.name] = hashlib.sha256(info.linkname.encode()).hexdigest()
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1024 * 1024):
                digest.update(chunk)
        return Bundle(path, digest.hexdigest(), path.stat().st_size, len(files), total, collected.skipped, digests)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
