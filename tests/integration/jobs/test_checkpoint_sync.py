"""Checkpoints outlive the machine: what a running job writes to $KILN_CHECKPOINT_DIR reaches the store while
it runs (only what changed), and once more when the attempt ends."""

from __future__ import annotations

import sys
import time

from tests.helpers import wait_for

SCRIPT = r"""
import os, pathlib, time
ck = pathlib.Path(os.environ["KILN_CHECKPOINT_DIR"])
(ck / "sub").mkdir(exist_ok=True)
(ck / "sub" / "model.bin").write_bytes(b"weights-1")
for i in range(40):
    if os.path.exists(os.environ["RELEASE"]):
        break
    time.sleep(0.1)
(ck / "sub" / "model.bin").write_bytes(b"weights-2")
"""


def test_running_jobs_checkpoints_reach_the_store(make_server, tmp_path):
    server = make_server(checkpoint_sync_seconds="0.3")
    client = server.client()
    release = tmp_path / "release"
    job = client.submit(
        {
            "command": [sys.executable, "-c", SCRIPT],
            "runtime": {"python": sys.executable},
            "env": {"RELEASE": str(release)},
        }
    )
    org = client.whoami().org_id
    stored = server.home / "store" / "orgs" / org / "jobs" / job.id / "checkpoints" / "sub" / "model.bin"
    deadline = time.monotonic() + 20
    while not stored.exists():  # copied while the job still runs
        assert time.monotonic() < deadline, "the checkpoint never reached the store"
        time.sleep(0.1)
    assert client.get_job(job.id).state == "RUNNING"
    assert stored.read_bytes() == b"weights-1"
    release.touch()
    assert wait_for(client, job.id).state == "SUCCEEDED"
    assert stored.read_bytes() == b"weights-2"  # the end of the attempt copies what changed since
