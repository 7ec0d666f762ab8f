"""A notebook on a Kiln server with KILN_BACKEND=kubernetes, against the FAKE Kubernetes API (tests/fakes/kube_api.py:
no cluster exists here), reached through Kiln's proxy at the address the backend reads from the cluster.

The test plays the kubelet: when the notebook's pod appears it runs that pod's container on this machine as the
pod spec says — the launcher from the ConfigMap Kiln shipped it in, the params file from the attempt's ConfigMap,
the job token and the notebook token from the attempt's Secret, every mount a directory here — with a real
JupyterLab (the python runtime's ``+lab`` variant, the ``lab_python`` fixture), listening on the loopback address
that the fake gave the notebook's Service as its cluster IP (the param ``ip``: the one thing the test changes,
as the pod's own address stands in for it). The pod's ``kiln-lab`` init container, which installs JupyterLab into
an image without it, is not run: the interpreter here has JupyterLab already. A kernel then runs a cell through
Kiln's proxy (REST and the kernel WebSocket), another organisation's user gets 404, and on stop the launcher, told
to stop as a pod is, saves the home through Kiln's API with the job token.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.backends.kubernetes.notebooks import LAUNCHER_ARGS, LAUNCHER_DIR, NOTEBOOK_PORT
from kiln.errors import Conflict, NotFound
from kiln.sdk.client import Client
from tests.fakes.kube_api import FakeKubeAPI
from tests.integration.notebooks.test_notebook_launcher import lab_python  # noqa: F401 - the fixture
from tests.integration.notebooks.test_notebooks import _channels, _execute, _kernel
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

pytestmark = pytest.mark.slow

Obj = dict[str, Any]


def _until(check: Any, timeout: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


@pytest.fixture
def cluster_ip() -> str:
    """A loopback address of this test's own: where the pod's JupyterLab listens, as the Service's cluster IP."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


@pytest.fixture
def fake(cluster_ip: str) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        api.add_node("node-1", cpu="16", memory="64Gi")
        api.cluster_ips.append(cluster_ip)
        api.graceful_pods = True  # a stopped notebook's pod saves its home before it is gone, as on a cluster
        yield api


@pytest.fixture
def kiln(make_server, fake: FakeKubeAPI) -> KilnServer:  # type: ignore[no-untyped-def]
    return make_server(backend="kubernetes", kubernetes_api_url=fake.url, kubernetes_namespace="kiln")  # type: ignore[no-any-return]


def _volume_files(fake: FakeKubeAPI, volume: Obj) -> dict[str, str]:
    """The files a ConfigMap volume (or a projected one of ConfigMaps) shows: path → content."""
    sources = (
        [s["configMap"] for s in volume["projected"]["sources"]] if "projected" in volume else [volume["configMap"]]
    )
    files: dict[str, str] = {}
    for source in sources:
        data = fake.get("ConfigMap", "kiln", source["name"])["data"]
        items = source.get("items") or [{"key": key, "path": key} for key in data]
        files |= {item["path"]: data[item["key"]] for item in items}
    return files


def _run_pod(fake: FakeKubeAPI, pod: Obj, root: Path, python: str, server: KilnServer, ip: str) -> subprocess.Popen:  # type: ignore[type-arg]
    """The pod's job container, run here: each mount a directory under ``root``, env as the spec says."""
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "job")
    secret_name = next(e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e)
    secret_data = fake.get("Secret", "kiln", secret_name)["data"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    places: dict[str, str] = {}
    for mount in sorted(container["volumeMounts"], key=lambda m: len(m["mountPath"])):
        local = root / mount["mountPath"].lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        places[mount["mountPath"]] = str(local)
        volume = volumes[mount["name"]]
        if "configMap" in volume or "projected" in volume:
            for path, content in _volume_files(fake, volume).items():
                (local / path).parent.mkdir(parents=True, exist_ok=True)
                (local / path).write_text(content)

    def here(value: str) -> str:
        for mount_path in sorted(places, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path + "/"):
                return places[mount_path] + value[len(mount_path) :]
        return value

    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    for item in container["env"]:
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = base64.b64decode(secret_data[ref["key"]]).decode()
        else:
            env[item["name"]] = here(item["value"])
    assert env["KILN_ENDPOINT"] == server.url, env["KILN_ENDPOINT"]  # the server's own endpoint, as configured
    params = Path(env["KILN_PARAMS_FILE"])
    launched = json.loads(params.read_text())
    assert launched["port"] == NOTEBOOK_PORT
    params.write_text(json.dumps({**launched, "ip": ip}))  # the pod's address: this test's loopback one
    args = [here(a) if a.startswith("/") else a for a in container["args"]]
    assert args == LAUNCHER_ARGS, args  # the launcher shipped in its ConfigMap, whatever the image holds
    args = [python, args[1], args[2].replace(LAUNCHER_DIR, places[LAUNCHER_DIR])]
    log = open(root / "pod.log", "wb")  # noqa: SIM115 - the process's, closed when the test ends
    return subprocess.Popen(args, cwd=here(container["workingDir"]), env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.timeout(600)
def test_a_notebook_on_the_cluster_is_reached_through_the_proxy_at_its_service(
    kiln: KilnServer,
    fake: FakeKubeAPI,
    cluster_ip: str,
    lab_python: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    admin = Api.admin(kiln)
    labs, other = create_tenant(admin, "labs", ("member",)), create_tenant(admin, "other", ("member",))
    owner = Client(kiln.url, labs.accounts["member"].key_id, labs.accounts["member"].secret)
    stranger = Client(kiln.url, other.accounts["member"].key_id, other.accounts["member"].secret)
    pod_process = None
    try:
        created = owner.create_notebook({"name": "onk8s", "runtime": {"framework": "python"}, "idle_timeout": 0})
        job_id = owner.get_notebook("onk8s").job_id
        assert job_id
        pods = _until(lambda: fake.pods(f"kiln.io/job={job_id}"), what="the notebook's pod")
        [pod] = pods
        notebook_objects = [
            (o["kind"], o["metadata"]["name"])
            for (kind, _, _), o in fake.objects.items()
            if (o["metadata"].get("labels") or {}).get("kiln.io/notebook") == created.id and kind != "Pod"
        ]
        service = next(
            o
            for (kind, _, _), o in fake.objects.items()
            if kind == "Service" and o["metadata"]["name"].endswith("-notebook")
        )
        assert ("NetworkPolicy", service["metadata"]["name"]) in notebook_objects, notebook_objects
        assert service["spec"]["clusterIP"] == cluster_ip
        with pytest.raises(Conflict, match="wait"):  # its pod not running yet: the proxy says so, never hangs
            owner.notebook_request(created.id, "GET", "api/status")

        pod_process = _run_pod(fake, pod, tmp_path / "pod", lab_python, kiln, cluster_ip)
        fake.set_running(pod["metadata"]["name"])
        ready = owner.wait_notebook("onk8s", timeout=300)
        assert ready.state == "RUNNING", (
            ready.state,
            ready.message,
            (tmp_path / "pod" / "pod.log").read_text()[-2000:],
        )

        kernel = _kernel(owner, created.id)
        with _channels(owner, kiln, created.id, kernel) as ws:
            code = (
                "import os; home = os.environ['HOME']; open(f'{home}/made-on-k8s.txt', 'w').write('kept'); print(home)"
            )
            status, printed = _execute(ws, code)
        assert status == "ok", printed
        home = tmp_path / "pod" / "kiln" / "home"
        assert printed.strip() == str(home)  # the pod's $HOME, JupyterLab's root
        listed = owner.notebook_request(created.id, "GET", "api/contents")
        assert listed.status_code == 200 and "made-on-k8s.txt" in {i["name"] for i in listed.json()["content"]}
        with pytest.raises(NotFound):
            stranger.notebook_request(created.id, "GET", "api/contents")

        owner.stop_notebook("onk8s")
        _until(
            lambda: all(j["metadata"].get("deletionTimestamp") for j in fake.jobs(f"kiln.io/job={job_id}")),
            what="the notebook's Job being deleted",
        )
        pod_process.send_signal(signal.SIGTERM)  # what the kubelet does to a deleted Job's pod
        assert pod_process.wait(timeout=60) == 0, (tmp_path / "pod" / "pod.log").read_text()[-2000:]
        fake.finish_deletions()
        assert owner.wait_notebook("onk8s", "STOPPED", timeout=60).state == "STOPPED"
        saved = owner.request("GET", f"/notebooks/{created.id}/home")  # the pod's home, saved through the API
        assert saved.status_code == 200
        with tarfile.open(fileobj=io.BytesIO(saved.content), mode="r:gz") as tar:
            assert tar.extractfile("made-on-k8s.txt").read() == b"kept"  # type: ignore[union-attr]
    finally:
        if pod_process is not None and pod_process.poll() is None:
            pod_process.kill()
            pod_process.wait()
        for client in (owner, stranger):
            client.close()
        close_all(labs, other)
        admin.close()
