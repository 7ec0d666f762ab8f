"""The rendered sbatch script, run by bash on this machine as a Slurm node would run it, against a real Kiln server.

No Slurm here (the real cluster's tests are tests/integration/slurm/): the variables a Slurm allocation sets
(``SLURM_JOB_ID``, ``SLURM_PROCID``, ``SLURM_JOB_NODELIST``, ``SLURMD_NODENAME``) are given by the test, and for a
gang ``srun`` and ``sbcast`` are fakes (below, named so) that start one member per task on this machine. The job
token is a real one: that of a job running on the local executor whose command sleeps (a token is only valid while
its attempt runs), whose code bundle the script fetches. The nodes' Python is one without Kiln installed when this
machine has one, so nothing of Kiln but what the script carries is used."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kiln.backends.slurm.render import SlurmJob, render
from kiln.domain.spec import JobSpec
from kiln.settings import SlurmSettings
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, job_spec, tar_gz

pytestmark = pytest.mark.heavy  # seconds each: make test-fast leaves it out

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
# Streams a node may not post: Kiln's own K (a job must not forge Kiln's messages), a made-up member, a line break.
BAD_STREAMS = (
    *("K", "K@worker0", "O@evil", "O@chief0", "O@worker", "E@ps", "O@worker12345", "O@worker1@ps0"),
    *("OE", "o", "", "E@ps0 ", "O\n", "O@worker1\n"),
)
HOLDER = "import os, sys, time; open(sys.argv[1], 'w').write(os.environ['KILN_JOB_TOKEN']); time.sleep(300)"

TRAIN = b"""
import os, sys, kiln
print("training on", open("settings.txt").read().strip(), "as", os.environ["KILN_JOB_ID"], flush=True)
print("cwd is the work dir:", os.getcwd() == os.environ["KILN_WORK_DIR"], flush=True)
print("a warning on stderr", file=sys.stderr, flush=True)
with open(os.path.join(os.environ["KILN_OUTPUT_DIR"], "model.txt"), "w") as fh:
    fh.write("weights=42\\n")
with open(os.path.join(os.environ["KILN_CHECKPOINT_DIR"], "step-1.ckpt"), "w") as fh:
    fh.write("step 1\\n")
kiln.log({"loss": 0.25}, step=1)
kiln.flush()
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""

# A rendezvous without any framework: rank 0 listens on MASTER_ADDR:MASTER_PORT, every other rank connects to it
# and sends its rank; rank 0 writes what it heard as an output.
RENDEZVOUS = b"""
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {world} local {os.environ['LOCAL_RANK']} master {addr}:{port} role {os.environ['KILN_ROLE']}",
      flush=True)
if rank == 0:
    server = socket.create_server(("", port))
    heard = []
    for _ in range(world - 1):
        conn, _ = server.accept()
        heard.append(int(conn.recv(16).decode()))
        conn.close()
    with open(os.path.join(os.environ["KILN_OUTPUT_DIR"], "rendezvous.txt"), "w") as fh:
        fh.write(",".join(map(str, sorted(heard))))
else:
    for _ in range(100):
        try:
            with socket.create_connection((addr, port), timeout=2) as conn:
                conn.sendall(str(rank).encode())
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(f"rank {rank}: rank 0 never answered at {addr}:{port}")
"""

# A fake srun (a stand-in for Slurm's, here where no Slurm runs): starts --ntasks copies of the command, task i with
# SLURM_PROCID=i and the i-th host of SLURM_JOB_NODELIST as its node name, and exits with the first failure's code.
FAKE_SRUN = r"""#!/usr/bin/env python3
import os, subprocess, sys
args = sys.argv[1:]
tasks = 1
while args and args[0].startswith("--"):
    option = args.pop(0)
    if option.startswith("--ntasks="):
        tasks = int(option.split("=", 1)[1])
hosts = os.environ["SLURM_JOB_NODELIST"].split(",")
with open(os.environ["FAKE_SRUN_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(i), "SLURMD_NODENAME": hosts[i]})
         for i in range(tasks)]
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""
FAKE_SBCAST = """#!/bin/sh
# A fake sbcast: every "node" is this machine, where the file already is.
echo "$@" >> "$FAKE_SRUN_LOG"
"""


def _wait(check: Any, timeout: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def _nodes_python() -> str:
    """A Python 3 on this machine without Kiln installed, if there is one (else this one)."""
    for name in ("python3", "python3.12", "python3.11"):
        found = shutil.which(name)
        if found and subprocess.run([found, "-c", "import kiln"], capture_output=True).returncode != 0:
            return found
    return sys.executable


def _holder(api: Api, server: KilnServer, sha: str) -> tuple[str, str]:
    """A running job with the code bundle ``sha`` and its job token."""
    job = api.ok(
        "POST", "/jobs", json_body={"spec": job_spec([sys.executable, "-c", HOLDER, "token"]), "code_sha256": sha}
    )
    token_file = server.home / "jobs" / job["id"] / "work" / "token"
    _wait(lambda: token_file.exists() and token_file.stat().st_size > 0, what="the holder's token")
    return job["id"], token_file.read_text()


def _run_script(
    tmp_path: Path, script: str, nodes: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("sbcast", FAKE_SBCAST)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_NNODES": str(len(nodes.split(","))),
        "SLURMD_NODENAME": nodes.split(",")[0],
        "SLURM_PROCID": "0",
        "FAKE_SRUN_LOG": str(tmp_path / "fake-srun.log"),
        **(extra_env or {}),
    }
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=180)


def _setup(make_server: Any, files: dict[str, bytes]) -> tuple[KilnServer, Api, str, str, str]:
    server: KilnServer = make_server()
    api = Api.admin(server)
    bundle, sha = tar_gz(files)
    assert api.request("PUT", f"/blobs/{sha}", content=bundle, unsigned=True).status_code == 201
    job_id, token = _holder(api, server, sha)
    return server, api, sha, job_id, token


def _settings(tmp_path: Path) -> SlurmSettings:
    (tmp_path / "scratch").mkdir(exist_ok=True)
    return SlurmSettings(python=_nodes_python(), scratch_dir=str(tmp_path / "scratch"), log_dir=str(tmp_path))


def _listing(api: Api, job_id: str, kind: str) -> dict[str, int]:
    return {item["path"]: item["size"] for item in api.ok("GET", f"/jobs/{job_id}/{kind}")["items"]}


def _log(api: Api, job_id: str) -> list[tuple[str, str]]:
    """The job's log as the server serves it: (stream, text) of each line ``<time> <stream> <text>``."""
    response = api.get(f"/jobs/{job_id}/logs")
    assert response.status_code == 200, response.text
    lines = []
    for line in response.text.splitlines():
        when, _, rest = line.partition(" ")
        stream, _, text = rest.partition(" ")
        assert TIMESTAMP.fullmatch(when), f"not a log line: {line!r}"
        lines.append((stream, text))
    return lines


def _members(log: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The lines the job's members sent (O and E, tagged or not): not Kiln's own (K)."""
    return [(stream, text) for stream, text in log if stream[0] in "OE"]


def test_the_script_fetches_the_code_runs_the_command_and_uploads_its_outputs(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, api, sha, job_id, token = _setup(make_server, {"train.py": TRAIN, "settings.txt": b"lr=0.1\n"})
    spec = JobSpec.model_validate(
        {
            "command": "python3 train.py",
            "prepare_command": "echo preparing in $(basename $PWD)",
            "finish_command": "echo finished with $KILN_EXIT_CODE",
        }
    )
    job = SlurmJob(job_id, "org-unused", 1, spec, endpoint=server.url, token=token, code_sha256=sha)
    result = _run_script(tmp_path, render(job, _settings(tmp_path)), "localhost")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"training on lr=0.1 as {job_id}" in result.stdout
    assert "cwd is the work dir: True" in result.stdout
    assert "preparing in work" in result.stdout and "finished with 0" in result.stdout
    assert f"kiln-fetch: code {sha[:12]} unpacked" in result.stdout
    assert "kiln-sync: ok checkpoints=1 outputs=1" in result.stderr
    # The command's output is in the job's log on the server (the node posted it: the server cannot read the
    # node's files), stdout as O and stderr as E, untagged (one member), by the time the script has ended.
    sent = _members(_log(api, job_id))
    assert ("O", f"training on lr=0.1 as {job_id}") in sent
    assert ("O", "cwd is the work dir: True") in sent
    assert ("O", "preparing in work") in sent and ("O", "finished with 0") in sent
    assert any(s == "O" and t.startswith(f"kiln-fetch: code {sha[:12]} unpacked") for s, t in sent)
    assert ("E", "a warning on stderr") in sent
    assert ("O", "a warning on stderr") not in sent
    assert {stream for stream, _ in sent} == {"O", "E"}
    # What the job left is in the store, through the API, as the server lists it.
    assert _listing(api, job_id, "artifacts") == {"model.txt": len("weights=42\n")}
    assert api.get(f"/jobs/{job_id}/artifacts/model.txt").content == b"weights=42\n"
    assert _listing(api, job_id, "checkpoints") == {"step-1.ckpt": len("step 1\n")}
    # kiln.log posted its point with the job token (the node has no Kiln: the script's SDK was imported).
    series = _wait(
        lambda: api.ok("GET", f"/jobs/{job_id}/metrics", params={"names": "loss"})["series"], what="the loss series"
    )
    assert "loss" in json.dumps(series)
    # Nothing is left on the "node": the member's directory and the archive are gone.
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_failing_command_exits_with_its_code_and_still_uploads(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, api, sha, job_id, token = _setup(make_server, {"train.py": TRAIN, "settings.txt": b"x\n"})
    spec = JobSpec.model_validate({"command": "python3 train.py", "env": {"EXIT_WITH": "3"}})
    job = SlurmJob(job_id, "org-unused", 1, spec, endpoint=server.url, token=token, code_sha256=sha)
    result = _run_script(tmp_path, render(job, _settings(tmp_path)), "localhost")
    assert result.returncode == 3, result.stdout + result.stderr
    assert _listing(api, job_id, "artifacts") == {"model.txt": len("weights=42\n")}


def test_a_wrong_token_fails_before_the_command_runs(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, api, sha, job_id, _token = _setup(make_server, {"train.py": TRAIN, "settings.txt": b"x\n"})
    spec = JobSpec.model_validate({"command": "python3 train.py"})
    job = SlurmJob(job_id, "org-unused", 1, spec, endpoint=server.url, token="not-a-token", code_sha256=sha)
    began = time.monotonic()
    result = _run_script(tmp_path, render(job, _settings(tmp_path)), "localhost")
    took = time.monotonic() - began
    assert result.returncode != 0
    assert "kiln-fetch:" in result.stderr and "the command did not run" in result.stderr
    assert "training on" not in result.stdout
    assert _listing(api, job_id, "artifacts") == {}
    # The shipper's first post was refused: it said so, posted nothing more, and the member ended at once (not
    # after LOG_CLOSE_SECONDS of trying to send what it had).
    assert "the server takes no more log lines (401)" in result.stderr
    assert took < 60, f"the script took {took:.0f} s"
    assert _members(_log(api, job_id)) == []


@pytest.mark.parametrize("procs", [1, 2])
def test_a_pytorch_gang_rendezvous_through_the_hosts_of_the_node_list(make_server, tmp_path: Path, procs: int) -> None:  # type: ignore[no-untyped-def]
    server, api, sha, job_id, token = _setup(make_server, {"rendezvous.py": RENDEZVOUS})
    spec = JobSpec.model_validate(
        {
            "command": "python3 rendezvous.py",
            "distributed": {"framework": "pytorch", "workers": 2, "procs_per_worker": procs},
        }
    )
    job = SlurmJob(job_id, "org-unused", 1, spec, endpoint=server.url, token=token, code_sha256=sha)
    # Two "nodes" that are both this machine, by two names: member 1's MASTER_ADDR must be member 0's name.
    result = _run_script(tmp_path, render(job, _settings(tmp_path)), "localhost,127.0.0.1")
    assert result.returncode == 0, result.stdout + result.stderr
    world = 2 * procs
    for rank in range(world):
        assert f"rank {rank} of {world} local {rank % procs} master localhost:" in result.stdout
    calls = (tmp_path / "fake-srun.log").read_text().splitlines()
    assert calls[0].startswith("--force ") and "--ntasks=2" in calls[1]
    assert api.get(f"/jobs/{job_id}/artifacts/rendezvous.txt").text == ",".join(map(str, range(1, world)))
    assert "ok skipped: only worker-0 uploads (this is worker-1)" in result.stderr
    # Each member posted its own lines to the job's log, tagged with its name, as the local executor tags them.
    # (A worker's local processes share its stdout and, unbuffered, print a line's text and its newline in two
    # writes: two ranks of one worker may share a line. Both are still that worker's.)
    sent = _members(_log(api, job_id))
    for rank in range(world):
        said = [(s, t) for s, t in sent if f"rank {rank} of {world} local {rank % procs} " in t]
        assert {s for s, _ in said} == {f"O@worker{rank // procs}"}, f"rank {rank}: {said}"
    assert {stream for stream, _ in sent} >= {"O@worker0", "O@worker1"}
    assert {stream.partition("@")[2] for stream, _ in sent} == {"worker0", "worker1"}  # none untagged


def test_posted_log_lines_name_a_valid_stream(make_server) -> None:  # type: ignore[no-untyped-def]
    """What a node may post to the job's log with its token: O or E, with a gang member's tag; not Kiln's own K
    (a job must not forge Kiln's messages) nor a made-up member."""
    server, api, _sha, job_id, token = _setup(make_server, {"train.py": TRAIN})
    node = Api(server.url, token=token)
    try:
        for stream in BAD_STREAMS:
            answer = node.request(
                "POST",
                f"/jobs/{job_id}/logs",
                params={"stream": stream},
                content=b"forged\n",
                content_type="text/plain",
            )
            assert answer.status_code == 422, f"stream={stream!r}: {answer.status_code} {answer.text}"
        # The same token and body with valid streams are taken (so the 422s above were the stream's).
        for stream in ("O", "E", "O@worker1", "E@ps0", "O@worker9999"):
            answer = node.request(
                "POST", f"/jobs/{job_id}/logs", params={"stream": stream}, content=f"from {stream}\n".encode()
            )
            assert answer.status_code == 200 and answer.json() == {"lines": 1}, answer.text
        answer = node.request("POST", f"/jobs/{job_id}/logs", content=b"no stream given\n")
        assert answer.status_code == 200, answer.text
    finally:
        node.close()
    sent = _members(_log(api, job_id))
    assert sent == [(s, f"from {s}") for s in ("O", "E", "O@worker1", "E@ps0", "O@worker9999")] + [
        ("O", "no stream given")
    ]
    assert all(text != "forged" for _, text in _log(api, job_id))
