"""The version an operator reads: the package's release plus the commit it was built from, e.g. ``0.2.0+g1f6b6de``.

Read where it is cheapest and truest, at most once per process: a source checkout's ``.git`` (HEAD and the ref it
names, two small files read directly: running ``git`` would cost a process start on every ``kiln --version``),
else the ``BUILD`` file ``make install`` writes beside this module (an installed copy has no ``.git``), else the
bare package version. Nothing here imports the rest of Kiln or touches the network.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from kiln import __version__

_PACKAGE = Path(__file__).resolve().parent
BUILD_FILE = _PACKAGE / "BUILD"  # one line: the full commit id (make install: git rev-parse HEAD)
_COMMIT = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")  # SHA-1 or SHA-256 object ids


def _git_dir(root: Path) -> tuple[Path, Path] | None:
    """(the checkout's git dir, the common dir holding its refs): a worktree's ``.git`` is a file naming them."""
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git, dot_git
    if dot_git.is_file():
        text = dot_git.read_text().strip()
        if not text.startswith("gitdir:"):
            return None
        git_dir = (root / text.removeprefix("gitdir:").strip()).resolve()
        common = git_dir / "commondir"
        common_dir = (git_dir / common.read_text().strip()).resolve() if common.is_file() else git_dir
        return git_dir, common_dir
    return None


def _resolve_ref(git_dir: Path, common_dir: Path, ref: str) -> str | None:
    for base in (git_dir, common_dir):
        path = base / ref
        if path.is_file():
            return path.read_text().strip()
    packed = common_dir / "packed-refs"  # `git gc` moves loose refs into this one file
    if packed.is_file():
        for line in packed.read_text().splitlines():
            commit, _, name = line.partition(" ")
            if name == ref:
                return commit
    return None


def checkout_commit(root: Path) -> str | None:
    """The commit a source checkout at ``root`` has checked out, read from its ``.git``; None when there is none."""
    try:
        dirs = _git_dir(root)
        if dirs is None:
            return None
        head = (dirs[0] / "HEAD").read_text().strip()
        commit = _resolve_ref(*dirs, head.removeprefix("ref:").strip()) if head.startswith("ref:") else head
    except OSError:
        return None
    return commit if commit and _COMMIT.match(commit) else None


def build_commit() -> str | None:
    """The commit Kiln runs from: its checkout's (src/kiln lies two levels below the repository's root), else the
    one ``make install`` recorded."""
    commit = checkout_commit(_PACKAGE.parent.parent)
    if commit is None:
        try:
            text = BUILD_FILE.read_text().strip()
        except OSError:
            return None
        commit = text if _COMMIT.match(text) else None
    return commit


@cache
def full_version() -> str:
    """``0.2.0+g1f6b6de`` (PEP 440's local version: the release, then ``g`` and the commit's first 7 digits, as
    ``git describe`` writes it), or ``0.2.0`` where the commit is unknown."""
    commit = build_commit()
    return f"{__version__}+g{commit[:7]}" if commit else __version__
