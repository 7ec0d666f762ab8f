"""Where a job's code came from: the commit of its git checkout and whether tracked files had changed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kiln.sdk.source_info import source_labels


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def test_a_checkouts_commit_and_dirtiness_and_nothing_elsewhere(tmp_path: Path) -> None:
    assert source_labels(tmp_path, {}) == {}  # not a checkout
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "src" / "train.py").write_text("print(1)\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert source_labels(repo / "src", {}) == {"git.commit": head, "git.dirty": "false"}
    (repo / "notes.txt").write_text("untracked: not a change of the code\n")
    assert source_labels(repo, {})["git.dirty"] == "false"
    (repo / "src" / "train.py").write_text("print(2)\n")
    assert source_labels(repo, {}) == {"git.commit": head, "git.dirty": "true"}
    assert source_labels(repo, {"git.commit": "mine"}) == {"git.dirty": "true"}  # what the user gave stays
