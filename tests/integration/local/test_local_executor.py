"""The local executor under stress: crashes, process trees, contention, GPUs, full disks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import log_text, spec, transitions, wait_for


def _shim_pid(home: Path, job_id: str, attempt: int = 1) -> int:
    return int(json.loads((home / "jobs" / job_id / "attempts" / str(attempt) / "shim.pid").read_text())["pid"])


def test_kill9_server_jobs_keep_running_and_finish_once(make_server, database_url, tmp_path):
    """The acceptance test of the core issue: kill -9 the server mid-job, start it again."""
    server = make_server(database_url, home=tmp_path / "home")
    client = server.client()
    # Half its lines, then it waits for the test's word (the file go in its work dir): it is still running
    # when the server comes back, however long that start takes.
    script = (
        "import os, time\nfor i in range(30):\n    print(f'line {i}', flush=True)\n    time.sleep(0.1)\n"
        "    while i == 15 and not os.path.exists('go'):\n        time.sleep(0.05)\n"
    )
    job = client.submit(spec(["python", "-c", script]))
    short = client.submit(spec(["sleep", "1"]))  # it ends while no server runs
    wait_for(client, job.id, "RUNNING")
    wait_for(client, short.id, "RUNNING")
    shim = _shim_pid(server.home, job.id)
    server.kill()
    assert psutil.pid_exists(shim), "the job's supervisor must survive the server"
    time.sleep(1.5)  # the job goes on printing (and the short one ends) while no server runs
    restarted = make_server(database_url, home=server.home)
    client = restarted.client()
    (server.home / "jobs" / job.id / "work" / "go").write_text("")
    done = wait_for(client, job.id, timeout=30)
    assert done.state == "SUCCEEDED"
    assert log_text(client, job.id) == [f"line {i}" for i in range(30)]
    assert wait_for(client, short.id).state == "SUCCEEDED"
    moves = transitions(client, job.id)
    assert moves.count(("RUNNING", "SUCCEEDED")) == 1
    assert [e.reason for e in client.events(job.id)].count("Reattached") == 1
    assert done.attempt == 1
    # The short job ended while no server ran: adopted with the outcome its shim recorded, not re-attached to.
    short_reasons = [e.reason for e in client.events(short.id)]
    assert "Adopted" in short_reasons and "Reattached" not in short_reasons, short_reasons
    assert client.get_job(short.id).exit_code == 0
    # Still once, after another restart.
    restarted.stop()
    client = make_server(database_url, home=server.home).client()
    time.sleep(0.5)
    assert transitions(client, job.id) == moves


def _job_processes(job_id: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KILN_JOB_ID") == job_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _live(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_cancel_kills_the_whole_process_tree(shared_server):
    """Children, grandchildren, a TERM-ignoring process and a setsid'd daemon all die on cancel."""
    script = r"""
import os, subprocess, sys, time
pids = [os.getpid()]
pids.append(subprocess.Popen(["sleep", "300"]).pid)
pids.append(subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"]).pid)
# A daemon that leaves the session: its parent exits, so it is re-parented to the shim (a subreaper).
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode()); time.sleep(300); os._exit(0)
    os._exit(0)
pids.append(int(os.read(r, 32)))
print("PIDS", " ".join(map(str, pids)), flush=True)
time.sleep(300)
"""
    client = shared_server.client()
    job = client.submit(spec(["python", "-c", script]))
    wait_for(client, job.id, "RUNNING")
    deadline = time.monotonic() + 20
    pids: list[int] = []
    while not pids and time.monotonic() < deadline:
        for line in log_text(client, job.id):
            if line.startswith("PIDS"):
                pids = [int(p) for p in line.split()[1:]]
        time.sleep(0.1)
    assert len(pids) == 4
    # The job runs in its own pid namespace: the pids it printed are its own; the machine's are found by the
    # job's environment. Both sleeps and the shell, the daemon and the job's python (and bubblewrap's own).
    everything = _job_processes(job.id)
    assert len(everything) >= 6, everything
    client.cancel(job.id)
    done = wait_for(client, job.id, timeout=30)
    assert done.state == "CANCELLED"
    time.sleep(0.2)
    assert _live(everything) == []
    assert "CancelRequested" in [e.reason for e in client.events(job.id)]
    # Who cancelled it, then what the supervisor saw (a bare "signal SIGTERM" told a user nothing).
    assert done.message and done.message.startswith(f"cancelled by {client.whoami().user_name}; signal SIGTERM")


def test_jobs_that_do_not_fit_together_run_one_after_the_other(make_server):
    server = make_server(cpus="2")
    client = server.client()
    first = client.submit(spec(["sleep", "1.5"], resources={"cpus": 2}))
    second = client.submit(spec(["sleep", "0.2"], resources={"cpus": 2}))
    wait_for(client, first.id, "RUNNING")
    waiting = client.get_job(second.id)
    assert waiting.state == "QUEUED"
    assert waiting.message and waiting.message.startswith("capacity: CPUs 2 asked, 0 free")
    first_done = wait_for(client, first.id)
    second_done = wait_for(client, second.id)
    assert first_done.state == second_done.state == "SUCCEEDED"
    assert second_done.running_at is not None and first_done.finished_at is not None
    assert second_done.running_at >= first_done.finished_at
    assert "Waiting" in [e.reason for e in client.events(second.id)]


def test_gpus_are_pinned_and_never_shared(make_server):
    client = make_server(gpus="0,1").client()
    show = ["sh", "-c", 'echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 1']
    a = client.submit(spec(show, resources={"gpus": 1}))
    b = client.submit(spec(show, resources={"gpus": 1}))
    c = client.submit(spec(show, resources={"gpus": 2}))
    for job in (a, b, c):
        assert wait_for(client, job.id).state == "SUCCEEDED"
    seen = {log_text(client, a.id)[0], log_text(client, b.id)[0]}
    assert seen == {"gpus=0", "gpus=1"}
    assert log_text(client, c.id) == ["gpus=0,1"]
    a_done, c_done = client.get_job(a.id), client.get_job(c.id)
    assert c_done.running_at >= a_done.finished_at  # type: ignore[operator]
    none = client.submit(spec('echo "[$CUDA_VISIBLE_DEVICES]"'))
    wait_for(client, none.id, "SUCCEEDED")
    assert log_text(client, none.id) == ["[]"]  # a CPU job sees no GPU at all


def test_dead_shim_fails_its_job_and_spares_the_others(shared_server):
    client = shared_server.client()
    victim = client.submit(spec(["python", "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(300)"]))
    bystander = client.submit(spec(["sleep", "2"]))
    wait_for(client, victim.id, "RUNNING")
    wait_for(client, bystander.id, "RUNNING")
    deadline = time.monotonic() + 10
    while not log_text(client, victim.id) and time.monotonic() < deadline:
        time.sleep(0.05)
    job_pids = _job_processes(victim.id)  # the machine's pids (the job printed its own namespace's)
    assert job_pids
    os.kill(_shim_pid(shared_server.home, victim.id), signal.SIGKILL)
    done = wait_for(client, victim.id, timeout=30)
    assert (done.state, done.reason) == ("FAILED", "ShimLost")
    assert "shim" in (done.message or "")
    time.sleep(0.3)
    assert _live(job_pids) == [], "the orphaned job process must be cleaned up"
    assert list(Path("/sys/fs/cgroup").glob(f"*/kiln/{victim.id}-*")) == []  # and its control groups removed
    assert wait_for(client, bystander.id).state == "SUCCEEDED"


@pytest.fixture
def small_log_disk(tmp_path: Path):
    """A 4 MiB tmpfs mounted where the server keeps job logs: a real ENOSPC, not a simulation."""
    logs = tmp_path / "home" / "logs"
    logs.mkdir(parents=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(logs)], capture_output=True)
    if result.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the full-disk test (needs root): {result.stderr.decode()}")
    yield tmp_path / "home"
    subprocess.run(["umount", "-l", str(logs)], check=False)


def test_full_disk_fails_the_job_with_the_reason(make_server, small_log_disk):
    client = make_server(home=small_log_disk).client()
    quiet = client.submit(spec(["sleep", "3"]))
    wait_for(client, quiet.id, "RUNNING")
    flood = client.submit(spec(["python", "-c", "import sys\nwhile True: sys.stdout.write('x' * 1000 + '\\n')"]))
    done = wait_for(client, flood.id, timeout=60)
    assert (done.state, done.reason) == ("FAILED", "DiskFull")
    assert "disk full" in (done.message or "")
    assert wait_for(client, quiet.id).state == "SUCCEEDED"
