"""The two-node Slurm test cluster (tests/slurm_cluster.py) does what Kiln's Slurm backend relies on: batch jobs
and their output files, a job spanning both nodes, fake GPUs handed out exclusively with CUDA_VISIBLE_DEVICES,
scancel, jobs reaching a server on the bridge address, and nothing of Slurm listening outside its namespaces."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import BRIDGE, SlurmCluster

WAIT = 60  # seconds: a job starts within about a second when the machine is idle, much later on a loaded one


def batch(body: str) -> str:
    return "#!/bin/bash\nset -eu\n" + body.strip() + "\n"


def wait_for_file(path: Path, timeout: float = WAIT) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() >= deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)
    return path.read_text()


def until_released(release: Path) -> str:
    """Shell that waits, up to WAIT seconds, for the test to create ``release``; fails the job otherwise."""
    return f'for _ in $(seq {WAIT * 10}); do [ -e "{release}" ] && break; sleep 0.1; done; [ -e "{release}" ]'


def test_sbatch_runs_a_script_and_its_output_file_appears(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = slurm_cluster.sbatch(
        batch('echo "hello from $(hostname) in job $SLURM_JOB_ID"'), f"--output={tmp_path}/out-%j.txt"
    )
    fields = slurm_cluster.wait_for_job(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=WAIT)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExitCode"] == "0:0"
    output = (tmp_path / f"out-{job_id}.txt").read_text()
    assert re.fullmatch(rf"hello from (node1|node2) in job {job_id}\n", output), output


def test_srun_runs_one_task_on_each_node(slurm_cluster: SlurmCluster) -> None:
    done = slurm_cluster.run("srun", "-N2", "-n2", "--ntasks-per-node=1", "hostname", timeout=WAIT)
    assert sorted(done.stdout.split()) == ["node1", "node2"]


def test_a_two_node_batch_job_spans_both_nodes_and_their_networks(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """What a gang launched with sbatch does: srun inside the batch script starts one task on each node; each task
    has its node's hostname and address (its own UTS and network namespace)."""
    script = batch(
        """srun bash -c 'echo "$SLURM_PROCID $(hostname) $(ip -4 -o addr show dev eth0 | awk "{print \\$4}")"'"""
    )
    job_id = slurm_cluster.sbatch(script, "--nodes=2", "--ntasks-per-node=1", f"--output={tmp_path}/gang.txt")
    fields = slurm_cluster.wait_for_job(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=WAIT)
    output = (tmp_path / "gang.txt").read_text()
    assert fields["JobState"] == "COMPLETED", output
    assert sorted(output.split("\n")[:-1]) == ["0 node1 10.77.0.11/24", "1 node2 10.77.0.12/24"], output
    assert fields["NodeList"] == "node[1-2]"


def test_two_jobs_wanting_both_gpus_of_a_node_run_one_after_the_other(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    body = f"""
echo "start $(date +%s.%N) $CUDA_VISIBLE_DEVICES"
{until_released(release)}
sleep 0.5
echo "end $(date +%s.%N)"
"""
    options = ("--gres=gpu:2", "--nodelist=node1")
    first = slurm_cluster.sbatch(batch(body), *options, f"--output={tmp_path}/first.txt")
    second = slurm_cluster.sbatch(batch(body), *options, f"--output={tmp_path}/second.txt")
    slurm_cluster.wait_for_job(first, "RUNNING", timeout=WAIT)
    # The node has CPUs and memory for both (the next test runs two jobs there at once): only the GPUs are taken.
    deadline = time.monotonic() + WAIT
    pending = slurm_cluster.job(second)
    # The scheduler gives its reason on its next pass; a job that starts meanwhile fails the test at once.
    while pending.get("JobState") == "PENDING" and pending.get("Reason") != "Resources":
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
        pending = slurm_cluster.job(second)
    assert (pending.get("JobState"), pending.get("Reason")) == ("PENDING", "Resources"), pending
    release.touch()
    for job_id in (first, second):
        fields = slurm_cluster.wait_for_job(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=WAIT)
        assert fields["JobState"] == "COMPLETED", fields
    first_start, first_end = (tmp_path / "first.txt").read_text().split("\n")[:2]
    second_start, _ = (tmp_path / "second.txt").read_text().split("\n")[:2]
    assert first_start.split()[2] == second_start.split()[2] == "0,1"
    assert float(second_start.split()[1]) >= float(first_end.split()[1])


def test_one_gpu_jobs_share_a_node_each_with_its_own_gpu(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Two jobs of one GPU each run at the same time on one node (each waits until the other has started), with
    different devices: the control for the test above, which shows the GPUs, not the CPUs, made them queue."""
    jobs = []
    for name, other in (("a", "b"), ("b", "a")):
        body = f"""
echo "$CUDA_VISIBLE_DEVICES" > "{tmp_path}/{name}.started"
{until_released(tmp_path / f"{other}.started")}
"""
        jobs.append(slurm_cluster.sbatch(batch(body), "--gres=gpu:1", "--nodelist=node2", "--output=/dev/null"))
    for job_id in jobs:
        fields = slurm_cluster.wait_for_job(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=WAIT * 2)
        assert fields["JobState"] == "COMPLETED", fields
    devices = sorted((tmp_path / f"{name}.started").read_text().strip() for name in ("a", "b"))
    assert devices == ["0", "1"]


def test_scancel_ends_a_running_job_and_its_processes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    job_id = slurm_cluster.sbatch(batch(f'echo $$ > "{pid_file}"\nexec sleep 600'), "--output=/dev/null")
    slurm_cluster.wait_for_job(job_id, "RUNNING", timeout=WAIT)
    pid = int(wait_for_file(pid_file))  # the nodes share this machine's process ids: only net and UTS are theirs
    assert Path(f"/proc/{pid}").exists()
    slurm_cluster.run("scancel", job_id)
    slurm_cluster.wait_for_job(job_id, "CANCELLED", timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), f"the job's process {pid} outlived scancel"


def test_a_job_reaches_a_server_on_the_bridge_address(slurm_cluster: SlurmCluster) -> None:
    """Where Kiln's server for the cluster listens: the bridge's address, reachable from every node."""
    with socket.socket() as server:
        server.bind((slurm_cluster.bridge_address, 0))
        server.listen()
        server.settimeout(WAIT)
        port = server.getsockname()[1]
        script = batch(f'echo "$(hostname) $SLURM_JOB_ID" > /dev/tcp/{slurm_cluster.bridge_address}/{port}')
        job_id = slurm_cluster.sbatch(script, "--nodelist=node2", "--output=/dev/null")
        conn, (peer, _) = server.accept()
        with conn:
            conn.settimeout(WAIT)
            received = b""
            while chunk := conn.recv(1024):
                received += chunk
    assert received.decode() == f"node2 {job_id}\n"
    assert peer == "10.77.0.12"
    assert slurm_cluster.wait_for_job(job_id, "COMPLETED", "FAILED", timeout=WAIT)["JobState"] == "COMPLETED"


def _machine_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if line.split()[1] != BRIDGE]


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def test_slurm_listens_only_inside_its_namespaces(slurm_cluster: SlurmCluster) -> None:
    """slurmctld and slurmd listen on every address of their own namespace: none of the machine's own addresses
    (loopback included) answers on Slurm's ports, while the controller does on its address on the bridge."""
    assert _accepts(slurm_cluster.controller.address, 6817)
    addresses = _machine_addresses()
    assert "127.0.0.1" in addresses
    listening = [(a, port) for a in addresses for port in (6817, 6818) if _accepts(a, port)]
    assert listening == []
