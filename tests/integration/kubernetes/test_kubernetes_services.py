"""Model services on a Kiln server with KILN_BACKEND=kubernetes, against the FAKE Kubernetes API
(tests/fakes/kube_api.py: no cluster exists here). A service is applied as the objects ``render_service`` renders
(Secret, ConfigMap, NetworkPolicy, Deployment, Service, and an HPA with autoscale), its state follows the
Deployment's ready replicas (which only a test hook of the fake sets: the fake runs no pods), an update to another
model version replaces the Deployment (a new ConfigMap, the same replica secret), a scale sets its replicas, and a
delete removes every object.

The model is trained the way a Kubernetes job's outputs reach Kiln: the job's pod (the fake's) is "running", and
the pod's sync sidecar program (podsync.py, run here in process) uploads the output file through the API with the
job token the server put in the job's Secret; then the job succeeds and its output is registered.

No predict can reach a pod here. What the router does with the address a backend gives it (one endpoint, the
Service's URL, with the replica secret) is tested against a tiny local HTTP server standing in for the
Kubernetes Service."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kiln.backends.kubernetes.podsync import Syncer
from kiln.backends.kubernetes.serving import (
    LABEL_REVISION,
    SECRET_PLACEHOLDER,
    service_base,
    service_selector,
    track_base,
)
from kiln.errors import KilnError, NotFound
from kiln.routing.router import Endpoint, Router
from kiln.sdk.client import Client
from tests.fakes.kube_api import FakeKubeAPI
from tests.helpers import wait_for
from tests.kilnserver import KilnServer

KINDS = ("Secret", "ConfigMap", "NetworkPolicy", "Deployment", "Service", "HorizontalPodAutoscaler")
MODEL_BYTES = b"not a real model: no replica loads it here\n"


def _until(check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        api.add_node("node-1", cpu="16", memory="64Gi")
        yield api


@pytest.fixture(scope="module")
def kiln(fake: FakeKubeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    home = tmp_path_factory.mktemp("k8s-services") / "home"
    server = KilnServer(home, backend="kubernetes", kubernetes_api_url=fake.url, kubernetes_namespace="kiln")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(kiln: KilnServer) -> Client:
    return kiln.client()


def _secret_data(obj: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}


@pytest.fixture(scope="module")
def model(kiln: KilnServer, client: Client, fake: FakeKubeAPI, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Versions 1 and 2 of model ``digits``, from the output of a job that ran on the (fake) cluster."""
    job = client.submit({"command": "python train.py", "runtime": {"framework": "python"}})
    (pod,) = _until(lambda: fake.pods(f"kiln.io/job={job.id}"))
    fake.set_running(pod["metadata"]["name"])
    wait_for(client, job.id, "RUNNING", timeout=20)
    (secret,) = fake.list("Secret", "kiln", f"kiln.io/job={job.id}")["items"]
    outputs = tmp_path_factory.mktemp("outputs")
    (outputs / "model.joblib").write_bytes(MODEL_BYTES)
    env = {
        "KILN_ENDPOINT": kiln.url,
        "KILN_JOB_TOKEN": _secret_data(secret)["token"],
        "KILN_JOB_ID": job.id,
        "KILN_OUTPUT_DIR": str(outputs),
        "KILN_RUN_DIR": str(tmp_path_factory.mktemp("run")),
    }
    syncer = Syncer(env)
    assert syncer.upload_outputs() == (1, len(MODEL_BYTES)), syncer.errors
    fake.set_terminated(pod["metadata"]["name"], exit_code=0)
    assert wait_for(client, job.id, timeout=20).state == "SUCCEEDED"
    # The same file twice: version 2 is registered as another framework (the same artifact again would answer 1).
    for version, framework in ((1, "sklearn"), (2, "custom")):
        assert client.register_model("digits", job.id, "model.joblib", framework=framework).version == version
    return "digits"


def _objects(fake: FakeKubeAPI, service_id: str) -> dict[tuple[str, str], dict[str, Any]]:
    selector = service_selector(service_id)
    return {
        (kind, obj["metadata"]["name"]): obj for kind in KINDS for obj in fake.list(kind, "kiln", selector)["items"]
    }


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """What an object says, less what the API server or the apply adds (ids, versions, owners, status) and less
    the revision label (the render route always renders revision 1)."""
    labels = {k: v for k, v in (obj["metadata"].get("labels") or {}).items() if k != LABEL_REVISION}
    body = {k: v for k, v in obj.items() if k in ("spec", "data", "immutable", "type")}
    if obj["kind"] == "Secret":
        body["data"] = sorted(_secret_data(obj) if "data" in obj else obj["stringData"])
    if obj["kind"] == "Service":  # the cluster IP the API server gave it
        body["spec"] = {k: v for k, v in body["spec"].items() if k not in ("clusterIP", "clusterIPs")}
    if obj["kind"] == "Deployment":
        template = json.loads(json.dumps(body["spec"]["template"]))
        template["metadata"]["labels"].pop(LABEL_REVISION)
        body["spec"] = {**body["spec"], "template": template}
    return {"kind": obj["kind"], "name": obj["metadata"]["name"], "labels": labels, **body}


def _settle(client: Client, fake: FakeKubeAPI, name: str, service_id: str, ready: int, state: str) -> Any:
    fake.set_deployment_ready(service_base(service_id), ready)
    return _until(lambda: (s := client.get_service(name)).state == state and s)


def test_a_service_is_applied_updated_scaled_and_deleted(client: Client, fake: FakeKubeAPI, model: str) -> None:
    spec = {
        "name": "digits",
        "model": f"{model}@1",
        "predictor": {"type": "sklearn"},
        "runtime": {"framework": "python"},
        "replicas": 2,
        "request_timeout": 2,
    }
    service = client.serve(spec)
    base = service_base(service.id)
    objects = _until(lambda: (o := _objects(fake, service.id)) and len(o) == 5 and o)
    rendered = client.render_service(spec)  # the render of the same spec, for the same service id
    assert sorted(map(_content, objects.values()), key=str) == sorted(map(_content, rendered), key=str)
    deployment = objects[("Deployment", base)]
    assert deployment["spec"]["replicas"] == 2
    uid = deployment["metadata"]["uid"]
    for (kind, _), obj in objects.items():  # the cluster removes the rest with the Deployment
        assert kind == "Deployment" or obj["metadata"]["ownerReferences"][0]["uid"] == uid, kind
    secret = _secret_data(objects[("Secret", base)])
    assert secret["replica-secret"] not in ("", SECRET_PLACEHOLDER)
    assert client.get_service("digits").state == "DEPLOYING"  # no replica ready yet

    fake.set_deployment_ready(base, 1)
    assert _until(lambda: "1 of 2" in (client.get_service("digits").message or ""))
    assert client.get_service("digits").state == "DEPLOYING"
    _settle(client, fake, "digits", service.id, 2, "READY")
    # Routed to the Service's cluster address, which does not exist here: the router tried it (and once more).
    with pytest.raises(KilnError, match="the replicas failed to answer"):  # 502, not 503: there was one to try
        client.predict("digits", [[0.0] * 64])

    # Another model version: the Deployment is replaced (a new ConfigMap, the same replica secret).
    (old_config,) = [name for kind, name in objects if kind == "ConfigMap"]
    updated = client.update_service("digits", model=f"{model}@2")
    assert updated.revision == 2
    deployment = _until(lambda: (d := fake.get("Deployment", "kiln", base))["metadata"]["generation"] == 2 and d)
    assert deployment["metadata"]["uid"] == uid
    assert deployment["metadata"]["annotations"]["kiln.io/model"] == f"{model}@2"
    assert deployment["spec"]["template"]["metadata"]["labels"][LABEL_REVISION] == "2"
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (new_config,) = [s["configMap"]["name"] for v in volumes for s in v.get("projected", {}).get("sources", [])]
    assert new_config != old_config
    configs = {name for kind, name in _objects(fake, service.id) if kind == "ConfigMap"}
    assert configs == {old_config, new_config}  # the old pods keep theirs until the service goes
    params = json.loads(fake.get("ConfigMap", "kiln", new_config)["data"]["params.json"])
    assert params["model"] == f"{model}@2"
    assert _secret_data(fake.get("Secret", "kiln", base))["replica-secret"] == secret["replica-secret"]
    assert _until(lambda: client.get_service("digits").state == "UPDATING")
    assert client.get_service("digits").revision == 2
    _settle(client, fake, "digits", service.id, 2, "READY")

    # Scale: the Deployment's replicas; to zero the router has nothing to send to (503), and a request asks for
    # one replica again (a cold start).
    client.scale_service("digits", 3)
    _until(lambda: fake.get("Deployment", "kiln", base)["spec"]["replicas"] == 3)
    _settle(client, fake, "digits", service.id, 3, "READY")
    client.scale_service("digits", 0)
    _until(lambda: fake.get("Deployment", "kiln", base)["spec"]["replicas"] == 0)
    _settle(client, fake, "digits", service.id, 0, "IDLE")
    with pytest.raises(KilnError, match="no ready replica"):  # 503 after request_timeout
        client.predict("digits", [[0.0] * 64])
    assert _until(lambda: fake.get("Deployment", "kiln", base)["spec"]["replicas"] == 1)

    client.delete_service("digits")
    _until(lambda: not _objects(fake, service.id))
    _until(lambda: _gone(client, "digits"))


def _gone(client: Client, name: str) -> bool:
    try:
        client.get_service(name)
    except NotFound:
        return True
    return False


def test_autoscale_renders_an_hpa_that_goes_when_autoscale_does(client: Client, fake: FakeKubeAPI, model: str) -> None:
    spec = {
        "name": "auto",
        "model": f"{model}@1",
        "predictor": {"type": "sklearn"},
        "runtime": {"framework": "python"},
        "autoscale": {"min": 0, "max": 4, "target_concurrency": 2},
    }
    service = client.serve(spec)
    base = service_base(service.id)
    objects = _until(lambda: (o := _objects(fake, service.id)) and len(o) == 6 and o)
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in client.render_service(spec)}
    hpa = objects[("HorizontalPodAutoscaler", base)]
    assert hpa["spec"] == rendered[("HorizontalPodAutoscaler", base)]["spec"]
    assert hpa["spec"]["minReplicas"] == 1 and hpa["spec"]["maxReplicas"] == 4
    assert "replicas" not in objects[("Deployment", base)]["spec"]  # the HPA's to set
    _settle(client, fake, "auto", service.id, 1, "READY")

    # The HPA chose 3 replicas; a new revision keeps them (it is not the render's to undo).
    fake.patch("Deployment", "kiln", base, {"spec": {"replicas": 3}})
    fixed = {**spec, "model": f"{model}@2"}
    client.update_service("auto", spec={**fixed})
    _until(lambda: fake.get("Deployment", "kiln", base)["metadata"]["annotations"]["kiln.io/model"] == f"{model}@2")
    assert fake.get("Deployment", "kiln", base)["spec"]["replicas"] == 3

    # Autoscale off: fixed replicas, and the HPA goes.
    fixed = {k: v for k, v in fixed.items() if k != "autoscale"}
    client.update_service("auto", spec={**fixed, "replicas": 2})
    _until(lambda: ("HorizontalPodAutoscaler", base) not in _objects(fake, service.id))
    assert fake.get("Deployment", "kiln", base)["spec"]["replicas"] == 2
    client.delete_service("auto")
    _until(lambda: not _objects(fake, service.id))


def _track(fake: FakeKubeAPI, service_id: str, track: str) -> dict[tuple[str, str], dict[str, Any]]:
    selector = service_selector(service_id, track)
    return {(k, o["metadata"]["name"]): o for k in KINDS for o in fake.list(k, "kiln", selector)["items"]}


def test_a_canary_and_a_shadow_are_deployments_of_their_own(client: Client, fake: FakeKubeAPI, model: str) -> None:
    """Through the API (issue 48): a canary is a second Deployment and Service with the canary's version and
    replicas, which a predict targeting its version is routed to; rollback deletes it; promote rolls the stable
    Deployment to its version and deletes it once the new stable pods are ready; a shadow is a third, of one pod.
    (The split between the tracks' Services: tests/integration/kubernetes/test_kubernetes_canaries.py.)"""
    spec = {
        "name": "released",
        "model": f"{model}@1",
        "predictor": {"type": "sklearn"},
        "runtime": {"framework": "python"},
        "request_timeout": 1,
    }
    service = client.serve(spec)
    base, canary = service_base(service.id), track_base(service.id, "canary")
    _until(lambda: ("Deployment", base) in _objects(fake, service.id))
    _settle(client, fake, "released", service.id, 1, "READY")

    client.update_service("released", model=f"{model}@2", canary=10, canary_replicas=2)
    objects = _until(lambda: (o := _track(fake, service.id, "canary")) and len(o) == 4 and o)
    assert sorted(kind for kind, _ in objects) == ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]
    deployment = objects[("Deployment", canary)]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["annotations"]["kiln.io/model"] == f"{model}@2"
    assert fake.get("Deployment", "kiln", base)["metadata"]["annotations"]["kiln.io/model"] == f"{model}@1"
    fake.set_deployment_ready(canary, 2)
    # Routed: a predict that targets the canary's version is sent to its Service (whose cluster address does not
    # exist here: 502 once tried), where none ready would wait for one and get 503.
    _until(lambda: _predict_error(client, 2) == "the replicas failed to answer")

    client.rollback_service("released")
    _until(lambda: not _track(fake, service.id, "canary"))
    assert fake.get("Deployment", "kiln", base)["metadata"]["annotations"]["kiln.io/model"] == f"{model}@1"

    client.update_service("released", model=f"{model}@2", canary=50)
    _until(lambda: ("Deployment", canary) in _track(fake, service.id, "canary"))
    fake.set_deployment_ready(canary, 1)
    _until(lambda: _predict_error(client, 2) == "the replicas failed to answer")
    client.promote_service("released")
    _until(lambda: fake.get("Deployment", "kiln", base)["metadata"]["annotations"]["kiln.io/model"] == f"{model}@2")
    assert ("Deployment", canary) in _track(fake, service.id, "canary")  # until the new stable pods are ready
    fake.set_deployment_ready(base, 1)
    _until(lambda: not _track(fake, service.id, "canary"))
    assert _until(lambda: (s := client.get_service("released")).state == "READY" and s).canary is None

    client.update_service("released", shadow=f"{model}@1")
    shadow = _until(lambda: _track(fake, service.id, "shadow").get(("Deployment", track_base(service.id, "shadow"))))
    assert shadow["spec"]["replicas"] == 1
    assert shadow["metadata"]["annotations"]["kiln.io/model"] == f"{model}@1"
    client.update_service("released", shadow="")
    _until(lambda: not _track(fake, service.id, "shadow"))
    client.delete_service("released")
    _until(lambda: not _objects(fake, service.id))


def _predict_error(client: Client, version: int) -> str:
    try:
        client.predict("released", [[0.0] * 64], version=version)
    except KilnError as exc:
        return "the replicas failed to answer" if "the replicas failed to answer" in str(exc) else str(exc)
    return "answered"


class _StandIn:
    """A local HTTP server in place of the Kubernetes Service (no cluster here): answers POST /predict, the first
    ``fail_first`` requests with 503 (a pod going away), and records each request's path and Authorization."""

    def __init__(self, fail_first: int = 0) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.fail_first = fail_first
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.seen.append((self.path, self.headers.get("Authorization")))
                if len(stand_in.seen) <= stand_in.fail_first:
                    status, answer = 503, b'{"code": "draining"}'
                else:
                    status, answer = 200, json.dumps({"outputs": json.loads(body)["inputs"]}).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.send_header("X-Kiln-Batch-Size", "1")
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _predict(router: Router, inputs: list[Any]) -> Any:
    try:
        return await router.predict("svc-1", json.dumps({"inputs": inputs}).encode(), timeout=5)
    finally:
        await router.aclose()


@pytest.mark.parametrize("fail_first", [0, 1])
def test_the_router_sends_predicts_to_a_backends_service_url(fail_first: int) -> None:
    stand_in = _StandIn(fail_first)
    try:
        router = Router()
        router.add("svc-1", Endpoint("svc-1", "", None, "s3cret", "digits@2", base_url=stand_in.url + "/"))
        answer = asyncio.run(_predict(router, [[1.0], [2.0]]))
    finally:
        stand_in.close()
    assert (answer.status, json.loads(answer.body), answer.model) == (200, {"outputs": [[1.0], [2.0]]}, "digits@2")
    # A 503 (a pod going away) is retried on the same Service, where another pod answers.
    assert stand_in.seen == [("/predict", "Bearer s3cret")] * (1 + fail_first)
    assert router.ready("svc-1") == ["svc-1"]  # one endpoint, never marked unusable for a pod's failure


def test_applying_again_changes_nothing_and_keeps_what_an_operator_put_in_the_secret(fake: FakeKubeAPI) -> None:
    """The backend alone (a restarted server applies every service once more): the same apply is a no-op for the
    Deployment (no new generation, no rollout); the replica secret and a model-fetch token an operator put in the
    Secret in place of the renderer's placeholder survive it; delete is idempotent."""
    from kiln.backends.kubernetes.backend import KubernetesBackend
    from kiln.backends.kubernetes.inputs import KubeConfig
    from kiln.backends.kubernetes.render import TOKEN_PLACEHOLDER
    from kiln.domain.serving import ServiceSpec

    backend = KubernetesBackend(fake.api_client(), KubeConfig(namespace="kiln"), endpoint="http://kiln:8080")
    spec = ServiceSpec.model_validate({"name": "again", "model": "m@1", "predictor": {"type": "sklearn"}})
    try:
        first = backend.apply_service("svc-again", "org-1", spec, ("m", 1), 1, None)
        base = service_base("svc-again")
        assert first.url == f"http://{base}.kiln.svc:8080"
        assert _secret_data(fake.get("Secret", "kiln", base))["token"] == TOKEN_PLACEHOLDER
        fake.patch("Secret", "kiln", base, {"data": {"token": base64.b64encode(b"operator-token").decode()}})
        fake.set_deployment_ready(base, 1)
        assert backend.service_ready("svc-again") == 1
        assert backend.apply_service("svc-again", "org-1", spec, ("m", 1), 1, None) == first
        assert fake.get("Deployment", "kiln", base)["metadata"]["generation"] == 1
        assert backend.service_ready("svc-again") == 1  # nothing to roll out: still ready
        assert _secret_data(fake.get("Secret", "kiln", base)) == {
            "token": "operator-token",
            "replica-secret": first.secret,
        }
        backend.apply_service("svc-again", "org-1", spec, ("m", 2), 2, None)
        assert backend.service_ready("svc-again") == 0  # the new revision has no ready replica yet
        backend.delete_service("svc-again")
        assert not _objects(fake, "svc-again")
        backend.delete_service("svc-again")  # what is gone counts as deleted
    finally:
        backend.close()
