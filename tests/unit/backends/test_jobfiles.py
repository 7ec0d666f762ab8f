"""A job's files as the server handles them: never through the job's links; freed when the job ends."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kiln.backends.local import jobfiles


def test_links_the_job_planted_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "server.key"
    secret.write_text("secret")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "other.bin").write_text("another job's")
    out = tmp_path / "outputs"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "model.bin").write_text("mine")
    (out / "key").symlink_to(secret)
    (out / "dir").symlink_to(tmp_path / "secrets", target_is_directory=True)
    os.mkfifo(out / "fifo")  # would block a plain open
    found = {}
    for rel, fd in jobfiles.files_beneath(out):
        with os.fdopen(fd) as fh:
            found[rel] = fh.read()
    assert found == {"sub/model.bin": "mine"}


def test_a_failed_jobs_files_go_once_kept_long_enough(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    ok, failed = jobs / "job-ok", jobs / "job-failed"
    for job in (ok, failed):
        for name in ("work", "outputs", "metrics"):
            (job / name).mkdir(parents=True)
            (job / name / "f").write_text("x")
    jobfiles.release(ok, 0)
    assert sorted(p.name for p in ok.iterdir()) == ["metrics"]  # the ingester may still be reading it
    jobfiles.release(failed, 3600)
    jobfiles.sweep(jobs)
    assert (failed / "work" / "f").exists()
    (failed / "release.json").write_text(json.dumps({"keep_until": time.time() - 1}))
    jobfiles.sweep(jobs)
    assert sorted(p.name for p in failed.iterdir()) == ["metrics"]
