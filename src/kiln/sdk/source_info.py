"""Where a job's code came from, as labels its run records: the git commit of the directory it was packed from
and whether the working tree had uncommitted changes (tracked files only). Nothing when the directory is not in a
git checkout, git is not installed, or the labels were given already."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

COMMIT_LABEL = "git.commit"
DIRTY_LABEL = "git.dirty"


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def source_labels(directory: Path, given: dict[str, str]) -> dict[str, str]:
    """``git.commit`` and ``git.dirty`` of ``directory``'s checkout, less what ``given`` already has."""
    if shutil.which("git") is None or (COMMIT_LABEL in given and DIRTY_LABEL in given):
        return {}
    commit = _git(directory, "rev-parse", "--verify", "HEAD")
    if commit is None:
        return {}
    status = _git(directory, "status", "--porcelain", "--untracked-files=no", "--", ".")
    found = {COMMIT_LABEL: commit.strip()}
    if status is not None:
        found[DIRTY_LABEL] = "true" if status.strip() else "false"
    return {k: v for k, v in found.items() if k not in given}
