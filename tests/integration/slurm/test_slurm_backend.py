"""Kiln's Slurm backend against the real two-node Slurm cluster (tests/slurm_cluster.py): a Kiln server with
``KILN_BACKEND=slurm`` listening on the cluster's bridge, its jobs submitted with sbatch, watched with squeue,
cancelled with scancel, their members reaching the server only through the API with their job tokens.

The runtimes the jobs name (sklearn, pytorch) are interpreters the "operator" installed where every node sees them:
the test runtimes a local server builds into .cache/test-runtimes, named in ``KILN_SLURM_RUNTIMES``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from kiln.errors import InvalidInput
from kiln.sdk.client import Client
from tests.helpers import log_text
from tests.kilnserver import REPO, TEST_RUNTIMES, KilnServer, SlurmServer
from tests.slurm_cluster import SlurmCluster

RUNTIMES = {"sklearn": "sklearn-1.9", "pytorch": "pytorch-2.13"}
# The module's server first installs the test runtimes where none are built yet (up to 900 s, in the setup of the
# module's first test).
pytestmark = pytest.mark.timeout(1200)
WAIT = 180  # seconds for a job: they take a few here, much longer on a loaded two-CPU machine


def _install_runtimes(tmp: Path) -> None:
    """The sklearn and pytorch test runtimes, built by a local server (once: .cache/test-runtimes is shared, and a
    build holds the runtime's lock, so an end-to-end test building the same one meanwhile is waited for)."""
    if all((TEST_RUNTIMES / entry / "bin" / "python").exists() for entry in RUNTIMES.values()):
        return
    builder = KilnServer(tmp / "builder").start()
    try:
        client = builder.client()
        for name in RUNTIMES:
            client.install_runtime(name)
        deadline = time.monotonic() + 900
        while True:
            status = {r.name: r.status for r in client.runtimes()}
            if all(status[entry] == "installed" for entry in RUNTIMES.values()):
                return
            assert time.monotonic() < deadline, f"the test runtimes did not install in time: {status}"
            time.sleep(2)
    finally:
        builder.stop()


@pytest.fixture(scope="module")
def server(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmServer]:
    root = tmp_path_factory.mktemp("slurm-kiln")
    _install_runtimes(root)
    runtimes = {name: str(TEST_RUNTIMES / entry / "bin" / "python") for name, entry in RUNTIMES.items()}
    server = SlurmServer(root / "home", slurm_cluster, slurm_runtimes=json.dumps(runtimes)).start()
    yield server
    server.stop()
    slurm_cluster.run("scancel", "--user=root", check=False)


@pytest.fixture(scope="module")
def client(server: SlurmServer) -> Client:
    return server.client()


def slurm_jobs(cluster: SlurmCluster, job_id: str) -> list[dict[str, str]]:
    """The Slurm jobs of every attempt of Kiln job ``job_id``: squeue's id, name, state and nodes."""
    done = cluster.run("squeue", "-h", "--states=all", "-O", "JobID:|,Name:|,State:|,NodeList:|")
    rows = [dict(zip(("id", "name", "state", "nodes"), (p.strip() for p in line.split("|")), strict=False))
            for line in done.stdout.splitlines()]  # fmt: skip
    return [row for row in rows if row["name"].startswith(f"kiln-{job_id}-a")]


def wait_state(client: Client, job_id: str, *states: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get_job(job_id)
        if job.state in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} is {job.state} ({job.message}), not {states}"
        time.sleep(0.2)


def wait_for(what: str, check: Any, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def held(release: Path, *before: str) -> str:
    """A job's Python: print ``before`` lines, then wait (up to WAIT s) for the test to create ``release``."""
    lines = "".join(f"print({line!r}, flush=True)\n" for line in before)
    return (
        f"import os, time\n{lines}"
        f"deadline = time.time() + {WAIT}\n"
        f"while not os.path.exists({str(release)!r}) and time.time() < deadline:\n    time.sleep(0.1)\n"
    )


def test_the_digits_example_runs_on_slurm_with_its_logs_metrics_and_artifact(
    client: Client, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    example = REPO / "examples" / "digits"
    job = client.run(yaml.safe_load((example / "kiln.yaml").read_text()), code_dir=example)
    done = client.wait(job.id, timeout=WAIT)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id)[-20:])
    [slurm] = slurm_jobs(slurm_cluster, job.id)
    assert (slurm["name"], slurm["state"]) == (f"kiln-{job.id}-a1", "COMPLETED")
    lines = log_text(client, job.id)
    assert any(line.startswith("epoch 3/3") for line in lines), lines
    summary = wait_for(  # extracted from the log the node posted, as the server reads it
        "the accuracy metric",
        lambda: (found := {m.name: m for m in client.metrics_summary(job.id)}) and "accuracy" in found and found,
    )
    assert float(summary["accuracy"].last_value) > 0.9, summary
    assert not {"checkpoints", "outputs", "bytes"} & set(summary), "Kiln's own sync line was read as metrics"
    files = {f.name: f for f in client.download(job.id, tmp_path / "out")}
    assert json.loads(files["metrics.json"].read_text())["accuracy"] > 0.9
    assert files["model.pkl"].stat().st_size > 1000


def test_logs_reach_the_server_while_the_job_runs_and_it_sees_no_server_secret(
    client: Client, server: SlurmServer, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    code = "import os\nprint('env has KILN_SECRET_KEY:', 'KILN_SECRET_KEY' in os.environ, flush=True)\n"
    spec = {"command": ["python", "-c", code + held(release, "first line")], "resources": {"cpus": 1}}
    server.env["KILN_SECRET_KEY"] = "must-not-reach-jobs"  # in the server's environment, as an operator's secrets are
    job = client.submit(spec)
    wait_for("the first line in Kiln's log", lambda: "first line" in log_text(client, job.id))
    assert client.get_job(job.id).state == "RUNNING"
    assert "env has KILN_SECRET_KEY: False" in log_text(client, job.id)  # --export=NONE
    release.touch()
    assert client.wait(job.id, timeout=WAIT).state == "SUCCEEDED"


def test_a_spec_slurm_can_never_run_is_refused_at_submit_in_slurms_words(client: Client) -> None:
    with pytest.raises(InvalidInput, match="Requested node configuration is not available"):
        client.submit({"command": "true", "resources": {"cpus": 1, "gpus": 3}})
    with pytest.raises(InvalidInput, match=r"runtime\.image"):
        client.submit({"command": "true", "runtime": {"image": "python:3.12"}})
    assert not [j for j in client.list_jobs(limit=200) if j.spec.resources.gpus == 3]  # nothing half-made


def test_cancel_ends_the_whole_gang_in_slurm(client: Client, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    marker = f"kiln-cancel-marker-{tmp_path.name}"
    spec = {
        "command": ["python", "-c", f"import time  # {marker}\nprint('up', flush=True)\ntime.sleep(600)"],
        "resources": {"cpus": 1},
        "distributed": {"framework": "pytorch", "workers": 2},
    }
    job = client.submit(spec)
    wait_state(client, job.id, "RUNNING")
    wait_for("both members up", lambda: sum(line == "up" for line in log_text(client, job.id)) == 2)
    [running] = slurm_jobs(slurm_cluster, job.id)
    assert running["nodes"] == "node[1-2]", running
    every = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    procs = [p for p in every if p.info["cmdline"][1:2] == ["-c"]]  # the job's own (not srun, the shells, Kiln's)
    assert len(procs) == 2, procs  # one per node
    client.cancel(job.id)
    assert wait_state(client, job.id, "CANCELLED").state == "CANCELLED"
    wait_for("Slurm to end the job", lambda: slurm_jobs(slurm_cluster, job.id)[0]["state"] == "CANCELLED")
    alive = psutil.wait_procs(every, timeout=30)[1]
    assert not alive, f"still running after the cancel: {alive}"


def test_two_jobs_wanting_a_nodes_two_gpus_run_one_after_the_other(client: Client, tmp_path: Path) -> None:
    code = (
        "import json, os, time\n"
        "start = time.time()\nprint('gpus', os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\ntime.sleep(2)\n"
        "out = os.environ['KILN_OUTPUT_DIR']\n"
        "json.dump({'start': start, 'end': time.time(), 'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'),\n"
        "           'node': os.uname().nodename}, open(os.path.join(out, 'gpus.json'), 'w'))\n"
    )
    spec = {
        "command": ["python", "-c", code],
        "resources": {"cpus": 1, "gpus": 2},
        "node_selector": {"kiln.io/hostname": "node1"},
    }
    jobs = [client.submit(spec) for _ in range(2)]
    runs = []
    for job in jobs:
        done = client.wait(job.id, timeout=WAIT)
        assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id))
        [path] = client.download(job.id, tmp_path / job.id)
        runs.append(json.loads(path.read_text()))
    assert [r["gpus"] for r in runs] == ["0,1", "0,1"]  # Slurm's, from the node's gres
    assert [r["node"] for r in runs] == ["node1", "node1"]
    first, second = sorted(runs, key=lambda r: r["start"])
    assert first["end"] <= second["start"], runs


def test_a_killed_server_restarted_reattaches_and_the_job_ends_once(
    server: SlurmServer, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    client = server.client()
    release = tmp_path / "release"
    spec = {"command": ["python", "-c", held(release, "before the crash") + "print('after the crash')"]}
    job = client.submit(spec)
    wait_for("the job's first line", lambda: "before the crash" in log_text(client, job.id))
    server.kill()
    release.touch()
    time.sleep(1)
    server.start()
    client = server.client()
    done = client.wait(job.id, timeout=WAIT)
    assert done.state == "SUCCEEDED", done.message
    assert done.attempt == 1 and done.restarts == 0
    assert [row["state"] for row in slurm_jobs(slurm_cluster, job.id)] == ["COMPLETED"]  # submitted once
    assert "after the crash" in log_text(client, job.id)
    started = [e for e in client.events(job.id) if e.to_state == "RUNNING"]
    assert len(started) == 1, started


def test_a_tuning_studys_trials_run_on_slurm(client: Client, slurm_cluster: SlurmCluster) -> None:
    study = client.tune(
        {
            "trial": {"command": "echo step=0 score={x}", "resources": {"cpus": 1}},
            "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
            "objective": {"metric": "score", "direction": "maximize"},
            "max_trials": 3,
            "parallelism": 2,
            "seed": 3,
        }
    )
    deadline = time.monotonic() + WAIT
    while (current := client.get_study(study.id)).state not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, current
        time.sleep(0.5)
    assert current.state == "SUCCEEDED", current
    trials = client.study_trials(study.id)
    assert len(trials) == 3
    for trial in trials:
        assert trial.value is not None and trial.job_id is not None, trial
        assert [row["state"] for row in slurm_jobs(slurm_cluster, trial.job_id)] == ["COMPLETED"]


@pytest.mark.timeout(900)  # the job waits up to 600 s
def test_a_two_worker_ddp_job_spans_both_nodes_and_ends_with_equal_weights(
    client: Client, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The torch-ddp example (gloo) as a gang of one worker per Slurm node: they rendezvous at worker 0's node
    address, and DDP must leave both with the same parameters (each prints its digest; worker 0 uploads its own)."""
    example = REPO / "examples" / "torch-ddp"
    spec = yaml.safe_load((example / "kiln.yaml").read_text())
    spec["env"]["STEPS"] = "60"
    job = client.run(spec, code_dir=example)
    done = client.wait(job.id, timeout=600)
    lines = client.stream_logs(job.id, follow=False)
    assert done.state == "SUCCEEDED", (done.message, [str(line) for line in lines][-30:])
    [slurm] = slurm_jobs(slurm_cluster, job.id)
    assert (slurm["state"], slurm["nodes"]) == ("COMPLETED", "node[1-2]"), slurm
    digests = {
        line.worker: line.text.split("digest=")[1].split()[0]
        for line in lines
        if line.source == "stdout" and "done digest=" in line.text
    }
    assert set(digests) == {"worker0", "worker1"}, digests  # each member's lines, tagged, from its own node
    assert digests["worker0"] == digests["worker1"], digests  # gradients were all-reduced across the nodes
    [rank0] = [p for p in client.download(job.id, tmp_path / "out") if p.name == "rank0.json"]
    assert json.loads(rank0.read_text())["world_size"] == 2
