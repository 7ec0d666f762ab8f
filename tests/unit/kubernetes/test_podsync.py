"""A pod's store traffic, with the pod programs run as real processes against a real Kiln server: the sync
sidecar (podsync.py) beside the real entrypoint (POSIX sh), the fetcher (podfetch.py) restoring checkpoints, and
the checkpoint routes' rules. The job token is a real one: that of a job running on the local executor whose
command sleeps (a token is only valid while its attempt runs)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import kiln.backends.kubernetes.podfetch as podfetch
import kiln.backends.kubernetes.podsync as podsync
from kiln.backends.kubernetes.render import KubeConfig, RenderInput, render
from kiln.domain.spec import JobSpec
from tests.kilnserver import KilnServer, free_port
from tests.tenancy_helpers import Api, job_spec

pytestmark = pytest.mark.heavy  # seconds each: make test-fast leaves it out

HOLDER = "import os, sys, time; open(sys.argv[1], 'w').write(os.environ['KILN_JOB_TOKEN']); time.sleep(300)"


def _wait(check: Any, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _holder(api: Api, server: KilnServer, name: str) -> tuple[str, str]:
    """A running job and its job token (written into its own work dir: the job sees nothing else)."""
    job = api.ok("POST", "/jobs", json_body={"spec": job_spec([sys.executable, "-c", HOLDER, f"{name}.token"])})
    token_file = server.home / "jobs" / job["id"] / "work" / f"{name}.token"
    _wait(lambda: token_file.exists() and token_file.stat().st_size > 0, what=f"{name}'s token")
    return job["id"], token_file.read_text()


def _pod_env(tmp_path: Path, endpoint: str, job_id: str, token: str, **extra: str) -> dict[str, str]:
    dirs = {"KILN_OUTPUT_DIR": "out", "KILN_CHECKPOINT_DIR": "ckpt", "KILN_RUN_DIR": "run", "KILN_WORK_DIR": "work"}
    for name in dirs.values():
        (tmp_path / name).mkdir(exist_ok=True)
    env = {key: str(tmp_path / name) for key, name in dirs.items()}
    return {
        **env,
        "KILN_ENDPOINT": endpoint,
        "KILN_JOB_TOKEN": token,
        "KILN_JOB_ID": job_id,
        "KILN_ROLE": "worker",
        "PATH": "/usr/bin:/bin",
        **extra,
    }


def _sidecar(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, podsync.__file__], env=env, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err.decode()


def _entrypoint(tmp_path: Path, env: dict[str, str], command: str, timeout: int) -> subprocess.CompletedProcess[bytes]:
    """The rendered entrypoint, run as the job container's PID 1 would run it."""
    objects = render(RenderInput("job-x", "org-x", 1, JobSpec.model_validate({"command": command})), KubeConfig())
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            for name, text in obj["data"].items():
                (conf / name).write_text(text)
    job = objects[-1]["spec"]["template"]["spec"]["containers"][0]
    run_env = {
        **env,
        "KILN_CONF_DIR": str(conf),
        "KILN_TENSORBOARD_DIR": str(tmp_path / "m" / "tb"),
        "KILN_SYNC_TIMEOUT": str(timeout),
    }
    args = [a.replace("$$", "$") for a in job["args"]]
    return subprocess.run(["/bin/sh", str(conf / "entrypoint.sh"), *args], env=run_env, capture_output=True, timeout=60)


def _listing(api: Api, job_id: str, kind: str) -> dict[str, int]:
    return {item["path"]: item["size"] for item in api.ok("GET", f"/jobs/{job_id}/{kind}")["items"]}


def test_sidecar_syncs_checkpoints_then_outputs_and_the_entrypoint_waits(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server: KilnServer = make_server()
    api = Api.admin(server)
    job_id, token = _holder(api, server, "holder")
    pod = tmp_path / "pod"
    pod.mkdir()
    env = _pod_env(pod, server.url, job_id, token, KILN_CHECKPOINT_SYNC_SECONDS="0.5")
    ckpt = Path(env["KILN_CHECKPOINT_DIR"])
    (ckpt / "sub").mkdir()
    (ckpt / "step-1.pt").write_bytes(b"weights one")
    (ckpt / "sub" / "opt.pt").write_bytes(b"optimizer")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not a checkpoint")
    os.symlink(outside / "secret.txt", ckpt / "link.pt")  # a file link and a directory link: both skipped
    os.symlink(outside, ckpt / "linked-dir")
    sidecar = _sidecar(env)
    try:
        _wait(lambda: len(_listing(api, job_id, "checkpoints")) == 2, what="the first checkpoint pass")
        assert _listing(api, job_id, "checkpoints") == {"step-1.pt": 11, "sub/opt.pt": 9}
        time.sleep(1.5)  # three more passes with nothing changed: nothing is sent again
        (tmp_path / "step-1.pt.tmp").write_bytes(b"weights two!")
        os.replace(tmp_path / "step-1.pt.tmp", ckpt / "step-1.pt")  # written then renamed
        _wait(lambda: _listing(api, job_id, "checkpoints").get("step-1.pt") == 12, what="the changed checkpoint")
        assert api.get(f"/jobs/{job_id}/checkpoints/step-1.pt").content == b"weights two!"

        # The command ends (exit 3): the entrypoint signals it, the sidecar uploads the outputs, then it exits 3.
        started = time.monotonic()
        done = _entrypoint(
            pod,
            env,
            "echo result > $KILN_OUTPUT_DIR/result.txt; mkdir -p $KILN_OUTPUT_DIR/d; "
            "echo deep > $KILN_OUTPUT_DIR/d/x.txt; exit 3",
            timeout=60,
        )
        assert done.returncode == 3, done.stderr
        assert time.monotonic() - started < 30
        assert b"kiln-sync: ok checkpoints=0 outputs=2" in done.stderr, done.stderr
        assert (Path(env["KILN_RUN_DIR"]) / "ended-worker-0").exists()
        assert _listing(api, job_id, "artifacts") == {"result.txt": 7, "d/x.txt": 5}
        assert api.get(f"/jobs/{job_id}/artifacts/d/x.txt").content == b"deep\n"
    finally:
        err = _stop(sidecar)
    uploads = [line for line in err.splitlines() if "checkpoint files" in line]
    assert uploads == [
        "kiln-sync: 2 checkpoint files (20 bytes) uploaded",
        "kiln-sync: 1 checkpoint files (12 bytes) uploaded",
    ]
    assert "skipping 'link.pt'" in err
    listed = _listing(api, job_id, "checkpoints")
    assert not any("secret" in path or "link" in path for path in listed), listed
    api.ok("POST", f"/jobs/{job_id}/cancel")


def test_restore_then_only_new_checkpoints_are_sent(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Attempt 2 of a pod: the fetcher restores the stored checkpoints (sizes checked) and records them, so the
    sidecar sends only what the attempt writes itself."""
    server: KilnServer = make_server()
    api = Api.admin(server)
    job_id, token = _holder(api, server, "holder")
    stored = {"step-5.pt": b"five" * 1000, "nested/dir/meta.json": b'{"step": 5}'}
    for path, data in stored.items():
        sha = hashlib.sha256(data).hexdigest()
        headers = {"Authorization": f"Bearer {token}", "X-Kiln-Content-SHA256": sha}
        response = httpx.put(f"{server.url}/api/v1/jobs/{job_id}/checkpoints/{path}", content=data, headers=headers)
        assert response.status_code == 201, response.text
    env = _pod_env(tmp_path, server.url, job_id, token, KILN_CHECKPOINT_SYNC_SECONDS="0.3")
    done = subprocess.run([sys.executable, podfetch.__file__], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"2 checkpoint files (4011 bytes) restored" in done.stdout
    ckpt = Path(env["KILN_CHECKPOINT_DIR"])
    assert {p: (ckpt / p).read_bytes() for p in stored} == stored
    state = json.loads((Path(env["KILN_RUN_DIR"]) / podfetch.SYNC_STATE).read_text())
    assert sorted(state) == sorted(stored)

    (ckpt / "step-6.pt").write_bytes(b"six")
    sidecar = _sidecar(env)
    try:
        _wait(lambda: "step-6.pt" in _listing(api, job_id, "checkpoints"), what="the new checkpoint")
        time.sleep(1)
    finally:
        err = _stop(sidecar)
    assert [line for line in err.splitlines() if "checkpoint files" in line] == [
        "kiln-sync: 1 checkpoint files (3 bytes) uploaded"
    ]
    api.ok("POST", f"/jobs/{job_id}/cancel")


def test_the_sidecar_keeps_a_pods_tensorboard_event_files_and_nothing_else_of_that_dir(
    make_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """What ``kiln tensorboard`` reads of a pod: its event files, as they grow; the route takes nothing else."""
    server: KilnServer = make_server()
    api = Api.admin(server)
    job_id, token = _holder(api, server, "holder")
    tb = tmp_path / "tb"
    (tb / "train").mkdir(parents=True)
    (tb / "train" / "events.out.tfevents.1.pod").write_bytes(b"first")
    (tb / "notes.txt").write_text("not an event file")
    env = _pod_env(
        tmp_path, server.url, job_id, token, KILN_CHECKPOINT_SYNC_SECONDS="0.3", KILN_TENSORBOARD_DIR=str(tb)
    )

    def kept() -> dict[str, bytes]:
        return {
            p.name: p.read_bytes() for p in server.home.rglob("*") if p.is_file() and f"{job_id}/tensorboard" in str(p)
        }

    sidecar = _sidecar(env)
    try:
        _wait(lambda: kept() == {"events.out.tfevents.1.pod": b"first"}, what="the event file")
        with open(tb / "train" / "events.out.tfevents.1.pod", "ab") as fh:
            fh.write(b"+more")
        _wait(lambda: kept() == {"events.out.tfevents.1.pod": b"first+more"}, what="what it gained")
    finally:
        _stop(sidecar)
    refused = httpx.put(
        f"{server.url}/api/v1/jobs/{job_id}/tensorboard/notes.txt",
        content=b"x",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert refused.status_code in (400, 422) and "event files only" in refused.text, refused.text
    assert "notes.txt" not in kept()
    api.ok("POST", f"/jobs/{job_id}/cancel")


def test_an_unreachable_server_gives_an_error_marker_not_a_hang(tmp_path: Path) -> None:
    env = _pod_env(tmp_path, f"http://127.0.0.1:{free_port()}", "job-x", "kiln-job-token")
    (Path(env["KILN_CHECKPOINT_DIR"]) / "c.pt").write_bytes(b"c")
    sidecar = _sidecar(env)
    try:
        started = time.monotonic()
        done = _entrypoint(tmp_path, env, "echo r > $KILN_OUTPUT_DIR/r.txt; exit 0", timeout=60)
        assert time.monotonic() - started < 30
        assert done.returncode == 0, done.stderr
        assert b"kiln-sync: error" in done.stderr and b"failed" in done.stderr, done.stderr
        marker = (Path(env["KILN_RUN_DIR"]) / "synced-worker-0").read_text()
        assert marker.startswith("error 2 uploads failed") and "127.0.0.1" in marker, marker
    finally:
        err = _stop(sidecar)
    assert "upload failed: checkpoint c.pt" in err and "upload failed: output r.txt" in err


def test_the_entrypoint_gives_up_waiting_after_the_bound(tmp_path: Path) -> None:
    env = _pod_env(tmp_path, "http://127.0.0.1:1", "job-x", "kiln-job-token")
    started = time.monotonic()
    done = _entrypoint(tmp_path, env, "exit 7", timeout=2)  # no sidecar at all
    assert done.returncode == 7
    assert 1.5 < time.monotonic() - started < 15
    assert b"did not report within 2s" in done.stderr, done.stderr


def test_members_other_than_worker_0_do_not_upload(tmp_path: Path) -> None:
    env = _pod_env(tmp_path, "http://127.0.0.1:1", "job-x", "t", JOB_COMPLETION_INDEX="1")
    (Path(env["KILN_OUTPUT_DIR"]) / "r.txt").write_text("r")
    sidecar = _sidecar(env)
    try:
        (Path(env["KILN_RUN_DIR"]) / "ended-worker-1").touch()
        marker = Path(env["KILN_RUN_DIR"]) / "synced-worker-1"
        _wait(marker.exists, 10, "the synced marker")
        assert marker.read_text().startswith("ok skipped: only worker-0 uploads")
    finally:
        _stop(sidecar)


def test_checkpoint_routes_rules(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server: KilnServer = make_server()
    api = Api.admin(server)
    job_a, token_a = _holder(api, server, "a")
    job_b, token_b = _holder(api, server, "b")

    def put(job: str, path: str, data: bytes, token: str, sha: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", "X-Kiln-Content-SHA256": sha or hashlib.sha256(data).hexdigest()}
        return httpx.put(f"{server.url}/api/v1/jobs/{job}/checkpoints/{path}", content=data, headers=headers)

    assert put(job_a, "ok.pt", b"a", token_a).status_code == 201
    # Job A's token cannot write or read job B's checkpoints.
    assert put(job_b, "x.pt", b"a", token_a).status_code in (403, 404)
    auth_a = {"Authorization": f"Bearer {token_a}"}
    assert httpx.get(f"{server.url}/api/v1/jobs/{job_b}/checkpoints", headers=auth_a).status_code in (403, 404)
    assert httpx.get(f"{server.url}/api/v1/jobs/{job_a}/checkpoints/ok.pt", headers=auth_a).content == b"a"
    # Paths that would leave the job's prefix: 400, nothing written.
    for raw in ("%2e%2e/%2e%2e/evil-1", "a/%2e%2e/%2e%2e/%2e%2e/evil-2", "%2Fetc%2Fevil-3", "a%5cevil-4"):
        response = put(job_a, raw, b"evil", token_a)
        assert response.status_code == 400, (raw, response.text)
    assert not list((server.home / "store").rglob("*evil*"))
    # A content hash that does not match the bytes: refused, nothing stored.
    assert put(job_a, "bad.pt", b"abc", token_a, sha="0" * 64).status_code == 400
    assert sorted(_listing(api, job_a, "checkpoints")) == ["ok.pt"]
    # The organisation's storage quota.
    org = api.ok("GET", "/whoami")["org_id"]
    api.ok("PUT", f"/orgs/{org}/quota", json_body={"category": "total", "storage": 1000})
    response = put(job_a, "big.pt", b"x" * 5000, token_a)
    assert response.status_code == 403 and "quota: storage" in response.text
    api.ok("PUT", f"/orgs/{org}/quota", json_body={"category": "total", "storage": None})
    # Once the job has ended: 409 for a user; its token is no longer valid at all.
    api.ok("POST", f"/jobs/{job_b}/cancel")
    _wait(lambda: api.ok("GET", f"/jobs/{job_b}")["state"] == "CANCELLED", what="job b cancelled")
    assert put(job_b, "late.pt", b"late", token_b).status_code == 401
    late = api.request("PUT", f"/jobs/{job_b}/checkpoints/late.pt", content=b"late")
    assert late.status_code == 409, late.text
    assert _listing(api, job_b, "checkpoints") == {}
    api.ok("POST", f"/jobs/{job_a}/cancel")


SDK_JOB = (
    "import kiln; print('kiln from', kiln.__file__); "
    "kiln.log({'loss': 0.5}, step=1); kiln.log({'loss': 0.25, 'acc': 0.75}, step=2)"
)


def test_import_kiln_in_a_pod_posts_metrics_with_the_job_token(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A pod's Python without Kiln gets the one-module SDK from the ConfigMap; its points reach the server with
    the job token (no spool directory in a pod). A Python that has a kiln package of its own keeps it."""
    server: KilnServer = make_server()
    api = Api.admin(server)
    job_id, token = _holder(api, server, "holder")
    pod = tmp_path / "pod"
    pod.mkdir()
    env = _pod_env(pod, server.url, job_id, token)
    done = _entrypoint(pod, env, f'python3 -c "{SDK_JOB}"', timeout=0)
    assert done.returncode == 0, done.stderr
    assert f"kiln from {pod / 'run' / 'pylib' / 'kiln' / '__init__.py'}" in done.stdout.decode(), done.stdout
    _wait(
        lambda: (
            {s["name"]: s["count"] for s in api.ok("GET", f"/jobs/{job_id}/metrics/summary")["series"]}
            == {"loss": 2, "acc": 1}
        ),
        what="the pod's SDK points",
    )
    # An image whose Python has Kiln installed: its own package is used, not shadowed.
    venv_bin = str(Path(sys.executable).parent)
    done = _entrypoint(pod, {**env, "PATH": f"{venv_bin}:/usr/bin:/bin"}, f'python3 -c "{SDK_JOB}"', timeout=0)
    assert done.returncode == 0, done.stderr
    assert "kiln from " + str(Path(podsync.__file__).parents[2] / "__init__.py") in done.stdout.decode()
    api.ok("POST", f"/jobs/{job_id}/cancel")
