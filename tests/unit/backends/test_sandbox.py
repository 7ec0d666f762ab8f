"""The sandbox's pieces that need no job: what the server finds at start, who a job runs as, what it sees."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kiln.backends.local import sandbox
from kiln.backends.local.python_policy import PythonPolicy
from kiln.injob import sandbox as runtime_sandbox
from kiln.settings import Settings


def test_without_bubblewrap_jobs_are_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    policy = sandbox.detect(Settings(home=tmp_path))
    assert policy.kind == "unavailable" and not policy.sandboxed
    assert policy.problem is not None
    assert "apt-get install bubblewrap" in policy.problem and "KILN_SANDBOX=none" in policy.problem


def test_none_is_the_operators_explicit_choice(tmp_path: Path) -> None:
    policy = sandbox.detect(Settings(home=tmp_path, sandbox="none"))
    assert (policy.kind, policy.problem, policy.sandboxed) == ("none", None, False)


def test_each_organisation_has_its_own_stable_uid() -> None:
    base = 1_500_000_000
    uids = {sandbox.org_uid(base, f"org-{i:04d}") for i in range(1000)}
    assert len(uids) == 1000
    assert all(base <= uid < base + sandbox.UID_SPAN for uid in uids)
    assert sandbox.org_uid(base, "org-0001") == sandbox.org_uid(base, "org-0001")


def test_a_venv_runtime_brings_the_python_it_was_made_from() -> None:
    policy = PythonPolicy(roots=(os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)))
    roots = policy.resolve(sys.executable, []).roots
    assert os.path.realpath(sys.prefix) in roots
    base = os.path.realpath(sys.base_prefix)
    assert any(base == root or base.startswith(root + "/") for root in roots) or base.startswith("/usr")


def test_the_command_line_binds_tmp_first_and_never_inside_a_writable_bind() -> None:
    box = {
        "bwrap": "bwrap",
        "setpriv": "setpriv",
        "prlimit": "prlimit",
        "uid": 1234,
        "gid": 1234,
        "ro": ["/usr", "/root/.pyenv/versions/3.11"],
        "rw": ["/srv/kiln/jobs/j/work", "/srv/kiln/jobs/j/work/tb", "/srv/kiln/jobs/j/outputs"],
        "scratch": "/srv/kiln/jobs/j/attempts/1/scratch",
        "chdir": "/srv/kiln/jobs/j/work",
    }
    argv = runtime_sandbox.wrap(box, ["python", "train.py"], "/scratch/tmp-1", rlimit_fsize=100)
    assert argv.index("/tmp") < argv.index("/srv/kiln/jobs/j/work")
    assert "/srv/kiln/jobs/j/work/tb" not in argv  # the job could swap it for a link between steps
    # /root is made 0755 so the job's uid can walk to the runtime; the job drops to its uid without capabilities.
    assert argv[argv.index("/root") - 3 : argv.index("/root") + 1] == ["--perms", "0755", "--dir", "/root"]
    tail = argv[argv.index("--", argv.index("--chdir")) :]
    assert tail[:3] == ["--", "setpriv", "--reuid=1234"] and "--bounding-set=-all" in tail
    assert tail[-5:] == ["prlimit", "--fsize=100", "--", "python", "train.py"]


def test_a_runtime_still_to_be_built_brings_the_python_it_will_be_made_from(tmp_path: Path) -> None:
    """The first job of a catalog runtime builds the venv in its shim: the sandbox is decided before the venv
    exists, and must already hold the interpreter the venv's python links to."""
    venv = str(tmp_path / "runtimes" / "sklearn")
    base = getattr(sys, "_base_executable", sys.executable)
    roots = PythonPolicy().catalog_roots(venv, [base])
    real = os.path.realpath(base)
    assert any(real.startswith(root + "/") for root in roots) or real.startswith("/usr/"), roots
    assert os.path.realpath(venv) in roots
