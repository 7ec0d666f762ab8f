"""A burst of jobs on the real two-node Slurm cluster (issue 51): Kiln's ``sbatch`` and ``squeue`` are wrapped by
scripts that log each call (start, end, arguments) and then run the real command, so the test counts what the
server asked Slurm. A burst's submissions are made side by side, none waiting for a ``squeue`` of its own (the
adoption check reads the queue pass's listing); a server SIGKILLed in the middle of a burst, started again,
submits no job twice."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kiln.sdk.client import Client
from tests.helpers import log_text
from tests.kilnserver import SlurmServer
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.timeout(900)
WAIT = 300  # seconds for a burst to end: a few tens here, minutes on a loaded two-CPU machine
TRIVIAL = {"command": "true"}

WRAPPER = """#!/bin/bash
echo "{tool} $(date +%s.%N) start $$ $*" >> {log}
{real} "$@"
rc=$?
echo "{tool} $(date +%s.%N) end $$" >> {log}
exit $rc
"""


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm-calls") / "calls.log"


@pytest.fixture(scope="module")
def server(slurm_cluster: SlurmCluster, calls: Path) -> Iterator[SlurmServer]:
    root = calls.parent
    wrapped = {}
    for tool in ("sbatch", "squeue"):
        real = shutil.which(tool)
        assert real, f"{tool} is not installed (make slurm-tools)"
        path = root / tool
        path.write_text(WRAPPER.format(tool=tool, log=calls, real=real))
        path.chmod(0o755)
        wrapped[f"slurm_{tool}"] = str(path)
    server = SlurmServer(root / "home", slurm_cluster, **wrapped).start()
    yield server
    server.stop()
    slurm_cluster.run("scancel", "--user=root", check=False)


def _lines(calls: Path, since: int = 0) -> list[list[str]]:
    return [line.split() for line in calls.read_text().splitlines()[since:]]


def _submissions(lines: list[list[str]]) -> list[list[str]]:
    """The sbatch calls that submitted (not a spec's check, ``--test-only``)."""
    return [x for x in lines if x[0] == "sbatch" and x[2] == "start" and "--test-only" not in x]


def _burst(client: Client, n: int) -> list[str]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: client.submit(TRIVIAL).id, range(n)))


def _all_succeeded(client: Client, ids: list[str]) -> None:
    deadline = time.monotonic() + WAIT
    for job_id in ids:
        done = client.wait(job_id, timeout=max(1.0, deadline - time.monotonic()))
        said = "\n".join(log_text(client, job_id))
        assert done.state == "SUCCEEDED", f"{job_id} {done.state} {done.message}:\n{said}"


def _slurm_jobs_named(cluster: SlurmCluster, job_id: str) -> list[str]:
    done = cluster.run("squeue", "-h", "--states=all", f"--name=kiln-{job_id}-a1", "-O", "JobID:|,State:|")
    return [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.strip()]


def test_a_burst_of_50_submits_side_by_side_with_no_squeue_per_submission(
    server: SlurmServer, calls: Path, slurm_cluster: SlurmCluster
) -> None:
    client = server.client()
    client.submit(TRIVIAL)  # the spec's check (sbatch --test-only) and the queue's first listing, before the count
    time.sleep(1)
    before = len(_lines(calls))
    ids = _burst(client, 50)
    _all_succeeded(client, ids)
    lines = _lines(calls, before)
    assert len(_submissions(lines)) == 50  # one sbatch per job
    by_name = [x for x in lines if x[0] == "squeue" and x[2] == "start" and any(a.startswith("--name=") for a in x)]
    assert by_name == []  # no submission waited for a squeue round trip of its own
    # The listing of every Kiln job, a pass's one squeue, is what the burst's state changes came from.
    assert any(x[0] == "squeue" and x[2] == "start" and "--states=all" in x for x in lines)
    for job_id in ids[:5]:
        assert _slurm_jobs_named(slurm_cluster, job_id) == ["COMPLETED"]


def test_a_server_killed_in_the_middle_of_a_burst_submits_no_job_twice(
    server: SlurmServer, calls: Path, slurm_cluster: SlurmCluster
) -> None:
    client = server.client()
    before = len(_lines(calls))
    ids: list[str] = []
    stop = threading.Event()

    def submit() -> None:  # a submit the kill interrupts is retried by the SDK, and lands on the restarted server
        while not stop.is_set() and len(ids) < 30:
            ids.append(client.submit(TRIVIAL).id)

    submitters = [threading.Thread(target=submit) for _ in range(4)]
    for thread in submitters:
        thread.start()
    deadline = time.monotonic() + WAIT
    while len(_submissions(_lines(calls, before))) < 5:  # killed once some are submitted and others are not
        assert time.monotonic() < deadline, "no submission seen"
        time.sleep(0.02)
    stop.set()
    server.kill()
    server.start()
    for thread in submitters:
        thread.join(timeout=120)
    submitted = list(ids)
    assert len(submitted) >= 5, submitted
    client = server.client()
    _all_succeeded(client, submitted)
    for job_id in submitted:
        assert _slurm_jobs_named(slurm_cluster, job_id) == ["COMPLETED"], job_id  # submitted once
        job = client.get_job(job_id)
        assert job.attempt == 1 and job.restarts == 0, (job_id, job.attempt, job.restarts)
