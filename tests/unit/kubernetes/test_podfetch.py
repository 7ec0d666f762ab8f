"""The init container's fetcher against a stand-in API on localhost: the code bundle and a dataset whose file
is answered with a redirect (as to a presigned store URL), which must not receive the job token."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kiln.backends.kubernetes.podfetch as podfetch

TOKEN = "kiln-job-token"


def _bundle() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _serve(routes: dict[str, tuple[int, dict[str, str], bytes]], seen: list[tuple[str, str | None]]) -> Any:
    return _serve_on(0, routes, seen)


def _serve_on(
    port: int, routes: dict[str, tuple[int, dict[str, str], bytes]], seen: list[tuple[str, str | None]]
) -> Any:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            status, headers, body = routes.get(self.path, (404, {}, b"{}"))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_fetches_code_and_datasets(tmp_path: Path) -> None:
    bundle = _bundle()
    data = b"1,2,3\n"
    seen: list[tuple[str, str | None]] = []
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
    server = _serve(routes, seen)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    manifest = {
        "version": 3,
        "items": [{"path": "a/b.csv", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}],
    }
    routes |= {
        "/api/v1/jobs/job-1/code": (200, {}, bundle),
        "/api/v1/datasets/mnist/versions/3": (200, {}, json.dumps(manifest).encode()),
        "/api/v1/datasets/mnist/versions/3/files/a/b.csv": (307, {"Location": f"{url}/store/blob?sig=x"}, b""),
        "/store/blob?sig=x": (200, {}, data),
    }
    env = {
        "KILN_ENDPOINT": url,
        "KILN_JOB_TOKEN": TOKEN,
        "KILN_JOB_ID": "job-1",
        "KILN_CODE_SHA256": hashlib.sha256(bundle).hexdigest(),
        "KILN_WORK_DIR": str(tmp_path / "work"),
        "KILN_INPUTS": json.dumps([{"dataset": "mnist@3", "dir": str(tmp_path / "in0")}]),
        "PATH": "/usr/bin:/bin",
    }
    try:
        done = subprocess.run([sys.executable, podfetch.__file__], env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "work" / "train.py").read_text() == "print('hi')\n"
        assert (tmp_path / "in0" / "a" / "b.csv").read_bytes() == data
        auth = dict(seen)
        assert auth["/api/v1/jobs/job-1/code"] == f"Bearer {TOKEN}"
        assert auth["/store/blob?sig=x"] is None  # the store never sees the job token
        # A bundle whose digest differs is refused.
        done = subprocess.run(
            [sys.executable, podfetch.__file__],
            env={**env, "KILN_CODE_SHA256": "0" * 64, "KILN_INPUTS": "[]"},
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 1 and b"SHA-256" in done.stderr
    finally:
        server.shutdown()


def test_a_restored_checkpoint_of_the_wrong_size_fails_the_pod(tmp_path: Path) -> None:
    """The listing's size is checked against what arrives (a checkpoint cut short must not be resumed from)."""
    seen: list[tuple[str, str | None]] = []
    listing = {"items": [{"path": "step-9.pt", "size": 10}]}
    routes = {
        "/api/v1/jobs/job-1/checkpoints": (200, {}, json.dumps(listing).encode()),
        "/api/v1/jobs/job-1/checkpoints/step-9.pt": (200, {}, b"short"),
    }
    server = _serve(routes, seen)
    env = {
        "KILN_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "KILN_JOB_TOKEN": TOKEN,
        "KILN_JOB_ID": "job-1",
        "KILN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "KILN_RUN_DIR": str(tmp_path / "run"),
        "PATH": "/usr/bin:/bin",
    }
    (tmp_path / "run").mkdir()
    try:
        done = subprocess.run([sys.executable, podfetch.__file__], env=env, capture_output=True, timeout=60)
        assert done.returncode == 1 and b"got 5 bytes, expected 10" in done.stderr, done.stderr
        assert not (tmp_path / "run" / podfetch.SYNC_STATE).exists()  # nothing recorded as synced
    finally:
        server.shutdown()


def test_a_model_input_is_staged_from_its_pinned_version(tmp_path: Path) -> None:
    """A job's ``inputs: [{model: NAME@VERSION}]`` on Kubernetes: the render lists it in KILN_INPUTS as a model,
    and the fetcher stages the version's files (checked) where the job reads it."""
    from kiln.backends.kubernetes.inputs import KubeConfig, RenderInput
    from kiln.backends.kubernetes.render import render
    from kiln.domain.spec import JobSpec

    spec = JobSpec.model_validate({"command": "true", "inputs": [{"model": "digits@2", "path": "/model"}]})
    objects = render(RenderInput("job-1", "org-1", 1, spec, token=TOKEN), KubeConfig())
    (job,) = [o for o in objects if o["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    fetch = next(c for c in pod["initContainers"] if c["name"] == "kiln-fetch")
    listed = json.loads(next(e["value"] for e in fetch["env"] if e["name"] == "KILN_INPUTS"))
    main = next(c for c in pod["containers"] if c["name"] == "job")
    assert [{k: v for k, v in i.items() if k != "dir"} for i in listed] == [{"model": "digits@2"}]
    assert {"name": "KILN_INPUT_DIGITS", "value": "/model"} in main["env"]

    data = b"weights"
    seen: list[tuple[str, str | None]] = []
    manifest = {"files": [{"path": "model.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}
    server = _serve(
        {
            "/api/v1/models/digits/versions/2": (200, {}, json.dumps(manifest).encode()),
            "/api/v1/models/digits/versions/2/files/model.pt": (200, {}, data),
        },
        seen,
    )
    env = {
        "KILN_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "KILN_JOB_TOKEN": TOKEN,
        "KILN_JOB_ID": "job-1",
        "KILN_INPUTS": json.dumps([{"model": "digits@2", "dir": str(tmp_path / "in0")}]),
        "PATH": "/usr/bin:/bin",
    }
    try:
        done = subprocess.run([sys.executable, podfetch.__file__], env=env, capture_output=True, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "in0" / "model.pt").read_bytes() == data
    assert b"model digits@2" in done.stdout
    assert all(auth == f"Bearer {TOKEN}" for _, auth in seen) and len(seen) == 2


def test_the_fetch_waits_for_an_api_that_is_away_and_gives_up_on_a_4xx(tmp_path: Path) -> None:
    """A server restarting (or failing over) as a job starts: its port refuses, then answers 503, then serves; the
    fetch asks again until it does (issue 51: a Slurm job that started while its server restarted failed at once
    with 'Connection refused'). A 403 will not get better: it fails at once."""
    bundle = _bundle()
    sha = hashlib.sha256(bundle).hexdigest()
    listener = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = listener.server_address[1]
    listener.server_close()  # the port refuses until the stand-in API starts on it
    env = {
        "KILN_ENDPOINT": f"http://127.0.0.1:{port}",
        "KILN_JOB_TOKEN": TOKEN,
        "KILN_JOB_ID": "job-1",
        "KILN_CODE_SHA256": sha,
        "KILN_WORK_DIR": str(tmp_path / "work"),
        "KILN_INPUTS": "[]",
        "KILN_FETCH_RETRY_SECONDS": "60",
        "PATH": "/usr/bin:/bin",
    }
    fetch = subprocess.Popen([sys.executable, podfetch.__file__], env=env, stderr=subprocess.PIPE)
    seen: list[tuple[str, str | None]] = []
    server = None
    try:
        time.sleep(1.0)  # refused meanwhile
        assert fetch.poll() is None, fetch.stderr.read() if fetch.stderr else b""
        routes = {"/api/v1/jobs/job-1/code": (503, {}, b"{}")}
        server = _serve_on(port, routes, seen)
        deadline = time.monotonic() + 30
        while not seen:  # answered 503 at least once
            assert time.monotonic() < deadline and fetch.poll() is None
            time.sleep(0.05)
        routes["/api/v1/jobs/job-1/code"] = (200, {}, bundle)
        assert fetch.wait(timeout=60) == 0, fetch.stderr.read() if fetch.stderr else b""
        assert (tmp_path / "work" / "train.py").read_text() == "print('hi')\n"
        routes["/api/v1/jobs/job-1/code"] = (403, {}, b"{}")
        began = time.monotonic()
        done = subprocess.run([sys.executable, podfetch.__file__], env=env, capture_output=True, timeout=60)
        assert done.returncode == 1 and b"403" in done.stderr, done.stderr
        assert time.monotonic() - began < 30  # not waited for
    finally:
        if fetch.poll() is None:
            fetch.kill()
        if server is not None:
            server.shutdown()
