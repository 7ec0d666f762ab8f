"""Distributed jobs on the local executor: every member of the gang gets the environment its framework's own
launcher would give it, consistent across the gang; logs are kept apart per member; cancel stops them all."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import psutil

from kiln.injob.logline import parse_tagged
from tests.tenancy_helpers import Api

PREFIXES = ("TF_", "JAX_", "KILN_", "MASTER_", "WORLD_", "RANK", "LOCAL_", "NODE_", "GROUP_", "ROLE_", "TORCHELASTIC_")
DUMP = [
    sys.executable,
    "-c",
    "import json, os; print('ENV ' + json.dumps({k: v for k, v in os.environ.items() if k.startswith("
    + repr(PREFIXES)
    + ")}), flush=True)",
]
RANK_PREFIX = re.compile(r"^\[\d+\] ")
# TensorFlow's members as they behave: a parameter server serves at its TF_CONFIG address until it is stopped,
# and each worker reaches every parameter server before it ends (so none is stopped before it has printed).
TF_MEMBER = [
    sys.executable,
    "-c",
    DUMP[2]
    + """
import socket, time
config = json.loads(os.environ["TF_CONFIG"])
addresses = [a.rsplit(":", 1) for a in config["cluster"]["ps"]]
if config["task"]["type"] == "ps":
    host, port = addresses[config["task"]["index"]]
    server = socket.create_server((host, int(port)))
    while True:
        server.accept()[0].close()
for host, port in addresses:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, f"parameter server {host}:{port} never answered"
            time.sleep(0.05)
""",
]


def _envs(api: Api, job_id: str) -> list[tuple[str, dict[str, str]]]:
    """(member tag, env) for every process that printed its environment."""
    out = []
    for line in api.get(f"/jobs/{job_id}/logs").text.splitlines():
        _, stream, member, text = parse_tagged(line)
        text = RANK_PREFIX.sub("", text)
        if stream == "O" and text.startswith("ENV "):
            out.append((member, json.loads(text[4:])))
    return out


def _run(api: Api, distributed: dict, command: list[str] = DUMP, **extra) -> list[tuple[str, dict[str, str]]]:  # type: ignore[type-arg]
    job = api.submit(command, resources={"cpus": 0.25}, distributed=distributed, **extra)
    done = api.wait(job["id"], timeout=60)
    assert done["state"] == "SUCCEEDED", done
    return _envs(api, job["id"])


def test_pytorch_workers_get_torchrun_environment(make_server):
    api = Api.admin(make_server(cpus="2"))
    envs = _run(api, {"framework": "pytorch", "workers": 2, "procs_per_worker": 2})
    assert len(envs) == 4
    ranks = sorted(int(e["RANK"]) for _, e in envs)
    assert ranks == [0, 1, 2, 3]
    assert {e["WORLD_SIZE"] for _, e in envs} == {"4"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for _, e in envs}) == 1
    for member, env in envs:
        worker = int(env["KILN_WORKER_INDEX"])
        assert member == f"worker{worker}"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == str(worker)
        assert int(env["RANK"]) == worker * 2 + int(env["LOCAL_RANK"])
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["KILN_NUM_WORKERS"] == "2"


def test_tensorflow_members_get_one_consistent_tf_config(make_server):
    api = Api.admin(make_server(cpus="2"))
    envs = _run(api, {"framework": "tensorflow", "workers": 3, "ps": 2}, TF_MEMBER)
    assert len(envs) == 5
    configs = [json.loads(e["TF_CONFIG"]) for _, e in envs]
    clusters = {json.dumps(c["cluster"], sort_keys=True) for c in configs}
    assert len(clusters) == 1  # everyone sees the same cluster
    cluster = configs[0]["cluster"]
    assert len(cluster["chief"]) == 1 and len(cluster["worker"]) == 2 and len(cluster["ps"]) == 2
    tasks = sorted((c["task"]["type"], c["task"]["index"]) for c in configs)
    assert tasks == [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    addresses = [a for role in cluster.values() for a in role]
    assert len(set(addresses)) == 5  # every task has its own address
    assert sorted(m for m, _ in envs) == ["ps0", "ps1", "worker0", "worker1", "worker2"]


def test_jax_processes_share_a_coordinator(make_server):
    api = Api.admin(make_server(cpus="2"))
    envs = _run(api, {"framework": "jax", "workers": 3})
    ids = sorted(int(e["JAX_PROCESS_ID"]) for _, e in envs)
    assert ids == [0, 1, 2]
    assert {e["JAX_NUM_PROCESSES"] for _, e in envs} == {"3"}
    assert len({e["JAX_COORDINATOR_ADDRESS"] for _, e in envs}) == 1


def test_mpi_launcher_gets_a_hostfile_for_every_slot(make_server):
    api = Api.admin(make_server(cpus="2"))
    envs = _run(api, {"framework": "mpi", "workers": 2, "procs_per_worker": 2})
    assert len(envs) == 1  # mpirun in worker 0 starts the ranks
    env = envs[0][1]
    hostfile = Path(env["KILN_MPI_HOSTFILE"]).read_text()
    slots = sum(int(m) for m in re.findall(r"slots=(\d+)", hostfile))
    assert slots == 4, hostfile
    assert "-np 4" in env["KILN_MPI_LAUNCHER"] and env["KILN_MPI_HOSTFILE"] in env["KILN_MPI_LAUNCHER"]


def test_cancel_stops_every_member(make_server):
    server = make_server(cpus="2")
    api = Api.admin(server)
    job = api.submit("sleep 60", resources={"cpus": 0.5}, distributed={"framework": "pytorch", "workers": 3})
    api.wait(job["id"], "RUNNING", timeout=30)
    members = server.home / "jobs" / job["id"] / "attempts" / "1" / "members"
    pids = [json.loads((d / "shim.pid").read_text())["pid"] for d in sorted(members.iterdir())]
    assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
    api.ok("POST", f"/jobs/{job['id']}/cancel")
    assert api.wait(job["id"], timeout=30)["state"] == "CANCELLED"
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_a_gang_survives_a_server_crash_and_is_taken_back(make_server):
    server = make_server(cpus="2")
    api = Api.admin(server)
    job = api.submit(
        "sleep 2; echo done $KILN_WORKER_INDEX", resources={"cpus": 1}, distributed={"framework": "jax", "workers": 2}
    )
    api.wait(job["id"], "RUNNING", timeout=30)
    server.kill()  # SIGKILL: no shutdown hooks
    server.start()
    api = Api.admin(server)
    done = api.wait(job["id"], timeout=60)
    assert (done["state"], done["attempt"], done["restarts"]) == ("SUCCEEDED", 1, 0), done
    reasons = [e["reason"] for e in api.events(job["id"])]
    # Re-attached to while its members ran, or (a slow restart) adopted with the outcome they recorded meanwhile.
    assert ("Reattached" in reasons) != ("Adopted" in reasons), reasons
    members = {member for member, _ in _tagged_output(api, job["id"], "done")}
    assert members == {"worker0", "worker1"}


def _tagged_output(api: Api, job_id: str, needle: str) -> list[tuple[str, str]]:
    out = []
    for line in api.get(f"/jobs/{job_id}/logs").text.splitlines():
        _, stream, member, text = parse_tagged(line)
        if stream == "O" and needle in text:
            out.append((member, text))
    return out
