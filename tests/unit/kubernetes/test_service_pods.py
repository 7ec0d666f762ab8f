"""The programs of a service replica's pod, run as real processes with the files laid out as the rendered
projected volume lays out the rendered ConfigMap (no cluster): the shipped ``kiln.injob.serve`` imports with the
standard library alone, ``replica.sh serve`` runs the real replica server on the rendered port with the rendered
secret, ``replica.sh healthz`` (the startup and readiness probe) passes only on a ready replica, and
``podmodel.py`` (the init container) stages a model version and a code bundle from a stand-in API."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.serving import render_service
from kiln.domain.serving import ServiceSpec

SVC = "svc-01jd5y3c2k7q4m9x2a"
ORG = "org-01jd5y3c2k7q4m9x2b"
SECRET = "the-replica-secret"
PREDICTOR = """
class Scaler:
    def load(self, path):
        with open(path) as fh:
            self.factor = float(fh.read())

    def predict(self, batch):
        return [[self.factor * x for x in row] for row in batch]
"""


def _render(**fields: Any) -> list[dict[str, Any]]:
    spec = ServiceSpec.model_validate(
        {
            "name": "scaler",
            "model": "scaler@1",
            "predictor": {"type": "custom", "class": "predictor:Scaler", "file": "factor.txt"},
            **fields,
        }
    )
    return render_service(SVC, ORG, spec, ("scaler", 1), KubeConfig(), replica_secret=SECRET, token="tok")


def _materialize(objects: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    """Write the ConfigMap's keys where the pod's projected volume puts them; the replica container."""
    data = {cm["metadata"]["name"]: cm["data"] for cm in objects if cm["kind"] == "ConfigMap"}
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "kiln-conf")
    for source in volume["projected"]["sources"]:
        files = data[source["configMap"]["name"]]
        for item in source["configMap"]["items"]:
            target = root / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[item["key"]])
    container: dict[str, Any] = pod["containers"][0]
    return container


def _pod_env(container: dict[str, Any], conf: Path, **overrides: str) -> dict[str, str]:
    """The replica container's literal env ($$ is Kubernetes' escaped $), its paths moved under ``conf``."""
    env = {e["name"]: e["value"].replace("$$", "$") for e in container["env"] if "value" in e}
    env = {k: v.replace("/etc/kiln", str(conf)) for k, v in env.items()}
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # python3 is the test's interpreter
    return {**env, "PATH": path, **overrides}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _probe(conf: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["/bin/sh", str(conf / "replica.sh"), "healthz"], env=env, cwd=cwd, capture_output=True, timeout=30
    )


def test_the_shipped_replica_server_imports_with_the_standard_library_alone(tmp_path: Path) -> None:
    container = _materialize(_render(), tmp_path)
    pylib = tmp_path / "pylib"
    env = _pod_env(container, tmp_path)
    assert env["PYTHONPATH"] == str(pylib)
    code = "import kiln, kiln.injob.serve as s; print(s.__file__); print(callable(kiln.log), callable(s.main))"
    # -S: no site-packages (so no installed kiln, numpy, ...): only the shipped files and the standard library.
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    where, callables = done.stdout.decode().splitlines()
    assert where == str(pylib / "kiln" / "injob" / "serve.py")
    assert callables == "True True"


@pytest.fixture
def healthz() -> Iterator[tuple[int, dict[str, Any]]]:
    """A stand-in /healthz: 401 without ``Bearer SECRET``, else ``answer``'s status and body."""
    answer: dict[str, Any] = {"status": 200, "body": {"ready": True}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/healthz" and self.headers.get("Authorization") == f"Bearer {SECRET}"
            status, body = (answer["status"], answer["body"]) if ok else (401, {"code": "unauthenticated"})
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], answer
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_passes_only_on_a_ready_replica_with_the_secret(
    tmp_path: Path, healthz: tuple[int, dict[str, Any]]
) -> None:
    port, answer = healthz
    container = _materialize(_render(), tmp_path / "conf")
    work = tmp_path / "work"
    work.mkdir()
    # A json.py in the work dir (the user's code) and a proxy in the user's env change nothing: the probe runs
    # isolated (-I) and never through a proxy.
    (work / "json.py").write_text("raise SystemExit('the user json module was imported')\n")
    dead_proxy = f"http://127.0.0.1:{_free_port()}"
    env = _pod_env(
        container,
        tmp_path / "conf",
        KILN_REPLICA_PORT=str(port),
        KILN_REPLICA_SECRET=SECRET,
        http_proxy=dead_proxy,
        HTTP_PROXY=dead_proxy,
    )
    done = _probe(tmp_path / "conf", env, work)
    assert done.returncode == 0, done.stderr.decode()
    failures = [
        ({**env, "KILN_REPLICA_SECRET": "wrong"}, "401"),
        ({**env, "KILN_REPLICA_PORT": str(_free_port())}, "refused"),
    ]
    for bad_env, says in failures:
        done = _probe(tmp_path / "conf", bad_env, work)
        assert done.returncode == 1 and says in done.stderr.decode(), done.stderr.decode()
    for status, body in ((200, {"ready": False}), (503, {"ready": False})):
        answer.update(status=status, body=body)
        done = _probe(tmp_path / "conf", env, work)
        assert done.returncode == 1 and b"kiln replica not ready" in done.stderr, done.stderr.decode()
    done = subprocess.run(
        ["/bin/sh", str(tmp_path / "conf" / "replica.sh"), "drain"],
        env={**env, "KILN_DRAIN_SECONDS": "0"},
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr.decode()


def _post(port: int, body: dict[str, Any], secret: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {secret}"} if secret else {})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", json.dumps(body).encode(), headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_the_rendered_pod_runs_the_replica_on_its_port_with_its_secret(tmp_path: Path) -> None:
    """replica.sh serve with the rendered env and params, a custom predictor from the work dir (the code bundle),
    the model where the init container stages it: the replica answers on KILN_REPLICA_PORT, demands
    KILN_REPLICA_SECRET, and the probe passes once the model has loaded."""
    conf, work, model = tmp_path / "conf", tmp_path / "work", tmp_path / "model"
    container = _materialize(_render(batching={"max_batch_size": 8, "max_latency_ms": 1}), conf)
    work.mkdir()
    model.mkdir()
    (work / "predictor.py").write_text(PREDICTOR)
    (model / "factor.txt").write_text("2.5")
    params = json.loads((conf / "params.json").read_text())
    assert params["model_dir"] == "/model"  # a mount in the pod; here, a temporary directory
    (conf / "params.json").write_text(json.dumps({**params, "model_dir": str(model)}))
    port = _free_port()
    env = _pod_env(container, conf, KILN_WORK_DIR=str(work), KILN_REPLICA_PORT=str(port), KILN_REPLICA_SECRET=SECRET)
    assert _probe(conf, env, work).returncode == 1  # nothing listens yet
    proc = subprocess.Popen(
        ["/bin/sh", str(conf / "replica.sh"), "serve"],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        state_file = work / ".kiln-replica.json"
        deadline = time.monotonic() + 60
        while not state_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state_file.exists(), proc.communicate()[1].decode() if proc.poll() is not None else "no state file"
        state = json.loads(state_file.read_text())
        assert (state["port"], state["secret"]) == (port, SECRET), "the replica must honour the rendered port/secret"
        done = _probe(conf, env, work)
        assert done.returncode == 0, done.stderr.decode()
        status, body = _post(port, {"inputs": [[1, 2], [4]]}, SECRET)
        assert (status, body) == (200, {"outputs": [[2.5, 5.0], [10.0]]})
        assert _post(port, {"inputs": [[1]]}, "wrong")[0] == 401
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends after preStop: drain, exit 0
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _bundle() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = PREDICTOR.encode()
        info = tarfile.TarInfo("predictor.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_init_container_stages_the_model_and_the_code(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    objects = _render()
    _materialize(objects, conf)  # podmodel.py imports podfetch.py from beside it, as in the pod
    weights, bundle = b"2.5", _bundle()
    seen: list[tuple[str, str | None]] = []
    manifest = {
        "version": 1,
        "files": [
            {"path": "factor.txt", "size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()},
            {"path": "sub/dir/meta.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
        ],
    }
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {}

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

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    base = "/api/v1/models/scaler/versions/1"
    routes |= {
        base: (200, {}, json.dumps(manifest).encode()),
        f"{base}/files/factor.txt": (307, {"Location": f"{url}/store/blob?sig=x"}, b""),
        "/store/blob?sig=x": (200, {}, weights),
        f"{base}/files/sub/dir/meta.json": (200, {}, b"{}"),
        "/api/v1/jobs/job-1/code": (200, {}, bundle),
    }
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    rendered_env = {e["name"]: e["value"] for e in pod["initContainers"][0]["env"] if "value" in e}
    assert rendered_env["KILN_MODEL"] == "scaler@1"
    env = {
        "KILN_ENDPOINT": url,
        "KILN_JOB_TOKEN": "tok",
        "KILN_MODEL": rendered_env["KILN_MODEL"],
        "KILN_MODEL_DIR": str(tmp_path / "model"),
        "KILN_JOB_ID": "job-1",
        "KILN_CODE_SHA256": hashlib.sha256(bundle).hexdigest(),
        "KILN_WORK_DIR": str(tmp_path / "work"),
        "TMPDIR": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    fetch = [sys.executable, str(conf / "podmodel.py")]
    try:
        done = subprocess.run(fetch, env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        assert (tmp_path / "model" / "factor.txt").read_bytes() == weights
        assert (tmp_path / "model" / "sub" / "dir" / "meta.json").read_bytes() == b"{}"
        assert (tmp_path / "work" / "predictor.py").read_text() == PREDICTOR
        assert b"model scaler@1 (2 files, 5 bytes) staged" in done.stdout
        auth = dict(seen)
        assert auth[base] == auth["/api/v1/jobs/job-1/code"] == "Bearer tok"
        assert auth["/store/blob?sig=x"] is None  # the store never sees the token
        # A file whose bytes differ from the manifest fails the pod before any replica starts.
        routes["/store/blob?sig=x"] = (200, {}, b"9.9")
        done = subprocess.run(fetch, env={**env, "KILN_CODE_SHA256": ""}, capture_output=True, timeout=60)
        assert done.returncode == 1 and b"SHA-256" in done.stderr, done.stderr.decode()
        # An alias is never fetched: the render pins the version number.
        done = subprocess.run(fetch, env={**env, "KILN_MODEL": "scaler@production"}, capture_output=True, timeout=60)
        assert done.returncode == 1 and b"KILN_MODEL" in done.stderr, done.stderr.decode()
    finally:
        server.shutdown()
        server.server_close()
