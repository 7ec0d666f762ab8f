"""The version an operator reads (kiln.version): the release plus the commit, read from a checkout's .git directly
(loose refs, packed refs, a detached HEAD, a worktree's .git file), shown by ``kiln --version``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kiln
from kiln.version import checkout_commit, full_version

REPO = Path(__file__).resolve().parents[2]
A = "1f6b6de" + "0" * 33
B = "09436b4" + "1" * 33


def git_head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout


def test_kiln_version_prints_the_release_and_the_commit_of_the_checkout() -> None:
    out = subprocess.run([sys.executable, "-m", "kiln", "--version"], capture_output=True, text=True, check=True)
    assert kiln.__version__ == "0.2.0"
    assert out.stdout.strip() == f"kiln 0.2.0+g{git_head()[:7]}"
    assert full_version() == f"0.2.0+g{git_head()[:7]}"


def test_the_commit_is_read_from_loose_and_packed_refs_a_detached_head_and_a_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    git = repo / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs with: peeled fully-peeled sorted\n{A} refs/heads/main\n")
    assert checkout_commit(repo) == A
    (git / "refs" / "heads" / "main").write_text(B + "\n")  # a loose ref is newer than the packed one
    assert checkout_commit(repo) == B
    (git / "HEAD").write_text(A + "\n")
    assert checkout_commit(repo) == A
    worktree = tmp_path / "wt"
    (git / "worktrees" / "wt").mkdir(parents=True)
    (git / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "worktrees" / "wt" / "commondir").write_text("../..\n")
    worktree.mkdir()
    (worktree / ".git").write_text(f"gitdir: {git / 'worktrees' / 'wt'}\n")
    assert checkout_commit(worktree) == B
    assert checkout_commit(tmp_path / "nothing") is None
    (git / "HEAD").write_text("ref: refs/heads/gone\n")
    assert checkout_commit(repo) is None
