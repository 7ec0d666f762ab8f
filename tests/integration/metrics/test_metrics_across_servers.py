"""A job's metrics follow it to the server that adopts it (issue 27): two servers with their own KILN_HOME on one
machine and one PostgreSQL. A job logs metrics on the first; the first is killed (-9) while the job goes on
logging under its shim, into its spool in the first server's home; the second adopts the job once the first's
lease ran out, and stores what the job logged after the kill, each step exactly once, while the job still runs
and after it ended. (Before, each server read only the spools in its own home: those steps waited for the dead
server to come back.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet

from kiln.sdk.client import Client
from tests.helpers import spec, wait_for

STEPS = 10
# Five steps, then it waits for the test's word (the file go in its work dir), then five more over a couple of
# seconds, then it waits for the word to end (end): its metrics are read while it runs.
SCRIPT = (
    "import os, time, kiln\n"
    f"for step in range({STEPS}):\n"
    "    kiln.log({'loss': 1 / (step + 1)}, step=step)\n"
    "    kiln.flush()\n"
    "    while step == 4 and not os.path.exists('go'):\n"
    "        time.sleep(0.05)\n"
    "    time.sleep(0.3)\n"
    "while not os.path.exists('end'):\n"
    "    time.sleep(0.05)\n"
)


def loss_steps(client: Client, job_id: str) -> list[int]:
    """The steps of the job's stored loss points (a step stored twice shows twice)."""
    found = client.metrics(job_id, names=["loss"])
    return [int(point[0]) for series in found for point in series.points]


def wait_for_steps(client: Client, job_id: str, count: int, timeout: float, what: str) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        steps = loss_steps(client, job_id)
        if len(steps) >= count:
            return steps
        assert time.monotonic() < deadline, f"{what}: only steps {steps} after {timeout}s"
        time.sleep(0.2)


def test_metrics_logged_after_the_launching_server_died_are_stored_once_by_the_survivor(
    make_server: Any, postgres_url: str, tmp_path: Path
) -> None:
    shared = {
        "server_key": Fernet.generate_key().decode(),
        "storage_url": str(tmp_path / "store"),
        "lease_seconds": "4",  # the second adopts the first's job soon after the first died
    }
    first = make_server(postgres_url, **shared)
    job = first.client().submit(spec(["python", "-c", SCRIPT], timeout=240))
    wait_for(first.client(), job.id, "RUNNING")
    second = make_server(postgres_url, **shared)  # started once the job runs on the first: it never places it
    creds = first.credentials()
    other = Client(second.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
    work = first.home / "jobs" / job.id / "work"

    assert wait_for_steps(other, job.id, 5, 30, "the steps before the kill") == list(range(5))
    first.kill()
    (work / "go").write_text("")  # the job logs its last five steps while its server is dead
    steps = wait_for_steps(other, job.id, STEPS, 60, "the steps logged after the kill, through the survivor")
    assert steps == list(range(STEPS))
    assert other.get_job(job.id).state == "RUNNING"  # read while it runs, by the server that adopted it

    (work / "end").write_text("")
    assert wait_for(other, job.id, timeout=60).state == "SUCCEEDED"
    # The survivor drained the ended job's spool too: still each step once.
    assert loss_steps(other, job.id) == list(range(STEPS))
    (summary,) = [s for s in other.metrics_summary(job.id) if s.name == "loss"]
    assert summary.count == STEPS and summary.last_step == STEPS - 1
