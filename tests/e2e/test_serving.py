"""Model serving end to end (issue 17), against one real server: examples/serving as it is.

A Kiln job trains the digits on scikit-learn (and, on the ``pytorch`` runtime, a TorchScript MLP on the same split);
each model is registered once from the job's outputs and served. What only these tests show, with real replicas
(jobs of category ``serve`` in the sandbox) behind Kiln's router:

- the served predictions equal the model's own ``predict`` in the training job (``expected.json``);
- a rolling update to version 2 and a replica's ``kill -9`` under constant load lose no request, and the service
  is whole again afterwards; scaling 2 → 0 → one request (a cold start) → 1 replica;
- tenancy: another organisation sees no service (404), a viewer cannot predict or update it (403), a service token
  predicts and does nothing else;
- a model that does not load fails its replica with the loader's error and the service DEGRADED, and a predict
  then gets 503 with Retry-After; a wrongly shaped instance is a 422 naming it.

Everything runs as a member of an organisation created for the module (its viewer and another organisation are
the tenancy test's callers). The tests share the service ``digits``: each first brings it to the replicas it needs.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from kiln.domain.serving import ReplicaRead, ReplicaState, ServiceRead, ServiceState
from kiln.domain.states import JobState
from kiln.errors import InvalidInput, NotFound
from kiln.sdk.client import Client
from kiln.sdk.services import LIVE_REPLICAS, ServiceClient
from tests.helpers import log_text, wait_for
from tests.kilnserver import REPO, KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "serving"
SERVICE = "digits"
SETTLE = 180.0  # seconds a service may take to reach a state (replicas start in ~3-10 s on a loaded machine)


@dataclass
class World:
    server: KilnServer
    a: Tenant  # the organisation the tests work in: its member deploys, its viewer only reads
    b: Tenant  # another organisation
    tmp: Path

    def client(self, role: str = "member", tenant: Tenant | None = None) -> Client:
        account = (tenant or self.a)[role]
        return Client(self.server.url, account.key_id, account.secret, timeout=120)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    # Room for every replica a test runs at once (a rolling update's surge included) beside a training job; no
    # rate limit, or the load threads' requests would get 429s that are not the router's doing.
    tmp = tmp_path_factory.mktemp("serving")
    server = KilnServer(tmp / "home", cpus="8", rate_limit_per_second="0").start()
    admin = Api.admin(server)
    a = create_tenant(admin, "serving-a", roles=("member", "viewer"))
    b = create_tenant(admin, "serving-b", roles=("member",))
    try:
        yield World(server, a, b, tmp)
    finally:
        close_all(a, b)
        admin.close()
        server.stop()


def train(client: Client, spec_file: str, dest: Path, timeout: float) -> str:
    """Run the example's job spec with the example's code; its outputs in ``dest``; the job's id."""
    spec = yaml.safe_load((EXAMPLE / spec_file).read_text())
    job = client.run(spec, EXAMPLE)
    done = wait_for(client, job.id, timeout=timeout)
    assert done.state == JobState.SUCCEEDED, f"{spec_file}: {done.message}: {log_text(client, job.id)[-15:]}"
    client.download(job.id, dest)
    return job.id


@dataclass
class Model:
    job_id: str
    expected: dict[str, Any]  # {"inputs": [...], "outputs": [...]}, the training job's own predictions
    outputs: Path


@pytest.fixture(scope="module")
def sklearn_model(world: World) -> Model:
    """digits@1: trained once (the sklearn runtime is built by the first job that needs it, ~20 s)."""
    client = world.client()
    out = world.tmp / "sklearn-outputs"
    job_id = train(client, "train_sklearn.yaml", out, timeout=600)
    version = client.register_model("digits", job_id, "model.joblib", framework="sklearn")
    assert (version.version, version.framework, version.lineage.job_id) == (1, "sklearn", job_id)
    return Model(job_id, json.loads((out / "expected.json").read_text()), out)


@pytest.fixture(scope="module")
def torch_model(world: World, sklearn_model: Model) -> Model:
    """digits-torch@1: the MLP trained on the digits dataset (the scikit-learn job's split) on the pytorch runtime,
    built by this job when no earlier test built it."""
    client = world.client()
    client.put_dataset(sklearn_model.outputs / "digits.npz", "digits")
    out = world.tmp / "torch-outputs"
    job_id = train(client, "train_torch.yaml", out, timeout=900)
    version = client.register_model("digits-torch", job_id, "model.pt", framework="torch")
    assert version.version == 1 and version.framework == "torch"
    return Model(job_id, json.loads((out / "expected.json").read_text()), out)


def service_spec(example: str, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLE / example).read_text())
    spec.update(changes)
    return spec


def live(service: ServiceRead) -> list[ReplicaRead]:
    """Its replicas that run or are about to (a service also lists those that failed lately)."""
    return [r for r in service.replicas if r.state in LIVE_REPLICAS]


def ready(client: Client, replicas: int) -> ServiceRead:
    """The service ``digits`` deployed (from examples/serving/service_sklearn.yaml) and READY with ``replicas``."""
    try:
        service = client.get_service(SERVICE)
    except NotFound:
        service = client.serve(service_spec("service_sklearn.yaml", replicas=replicas))
    if service.desired_replicas != replicas:
        client.scale_service(SERVICE, replicas)
    service = client.wait_service(SERVICE, timeout=SETTLE)
    assert service.state == ServiceState.READY, f"{service.state}: {service.message} {service.replicas}"
    assert service.ready_replicas == replicas, service.replicas
    return service


@dataclass
class Load:
    """Threads predicting one instance at a time, as fast as the service answers, until stopped; every answer's
    model (NAME@VERSION) and time kept, and every failure."""

    world: World
    instance: list[float]
    threads: int = 4
    answers: list[tuple[float, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for i in range(self.threads):
            worker = threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(150)

    def _run(self) -> None:
        with self.world.client() as client:
            while not self._stop.is_set():
                try:
                    answer = client.predict(SERVICE, [self.instance])
                except Exception as exc:  # every failure is the test's business, whatever it is
                    with self._lock:
                        self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.answers.append((time.monotonic(), answer.model))

    def answered_since(self, moment: float) -> list[str]:
        with self._lock:
            return [model for at, model in self.answers if at > moment]

    def wait_answers(self, since: float, count: int, timeout: float = 60) -> None:
        """Until ``count`` answers came after ``since`` (the load kept going through what the test did)."""
        deadline = time.monotonic() + timeout
        while len(self.answered_since(since)) < count:
            assert time.monotonic() < deadline, f"only {len(self.answered_since(since))} answers; {self.failures[:3]}"
            assert not self._stop.is_set()
            time.sleep(0.05)


def serve_process(server: KilnServer, job_id: str) -> psutil.Process:
    """The replica's ``python -m kiln.injob.serve`` as this machine sees it (the pid in its state file is the
    one inside the sandbox's PID namespace): a descendant of the job's shim."""
    for pid_file in server.home.glob(f"jobs/{job_id}/attempts/**/shim.pid"):
        shim = psutil.Process(int(json.loads(pid_file.read_text())["pid"]))
        for child in shim.children(recursive=True):
            if child.cmdline()[1:3] == ["-m", "kiln.injob.serve"]:
                return child
    raise AssertionError(f"no replica process under the shim of job {job_id}")


def inet_sockets(pid: int) -> set[str]:
    """The TCP and UDP sockets a process holds (inodes), as the tables of its own network namespace list them."""
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    held = {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}
    listed: set[str] = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if path.exists():
            listed |= {line.split()[9] for line in path.read_text().splitlines()[1:] if line.strip()}
    return held & listed


# -- predictions ----------------------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_sklearn_service_predicts_what_the_model_predicts(world: World, sklearn_model: Model) -> None:
    client = world.client()
    service = ready(client, 2)
    assert [r.model_version for r in live(service)] == [1, 1]
    assert service.endpoint == f"{world.server.url}/api/v1/services/{SERVICE}/predict"
    answer = client.predict(SERVICE, sklearn_model.expected["inputs"])
    assert answer.model == "digits@1"
    assert answer.outputs == sklearn_model.expected["outputs"]
    # Either replica answers the same: one instance at a time, so that both get some.
    singles = [client.predict(SERVICE, [x]).outputs[0] for x in sklearn_model.expected["inputs"][:8]]
    assert singles == sklearn_model.expected["outputs"][:8]


@pytest.mark.timeout(600)
def test_replicas_listen_on_a_socket_in_their_work_dir_and_open_no_port(world: World, sklearn_model: Model) -> None:
    """The router reaches a replica through its Unix socket (the job's network namespace is its own): the replica
    holds no TCP or UDP socket, and its state file names the socket, no port."""
    client = world.client()
    service = ready(client, 2)
    for replica in live(service):
        assert replica.job_id is not None
        assert replica.message == "serving digits@1 on its socket .kiln-replica.sock", replica.message
        work = world.server.home / "jobs" / replica.job_id / "work"
        state = json.loads((work / ".kiln-replica.json").read_text())
        assert sorted(state) == ["pid", "secret", "socket"] and state["socket"] == ".kiln-replica.sock"
        assert stat.S_ISSOCK((work / state["socket"]).lstat().st_mode)
        assert inet_sockets(serve_process(world.server, replica.job_id).pid) == set()
    answer = client.predict(SERVICE, sklearn_model.expected["inputs"][:2])  # through a socket: no other way
    assert answer.outputs == sklearn_model.expected["outputs"][:2]


@pytest.mark.timeout(600)
def test_a_wrongly_shaped_instance_is_a_422_naming_it(world: World, sklearn_model: Model) -> None:
    client = world.client()
    ready(client, 2)
    good = sklearn_model.expected["inputs"][0]
    with pytest.raises(InvalidInput, match=r"inputs\[1\]") as refused:
        client.predict(SERVICE, [good, good[:63], good])  # the model says it takes 64 features
    assert refused.value.status == 422
    raw = Api(world.server.url, world.a["member"].key_id, world.a["member"].secret)
    try:
        response = raw.post(f"/services/{SERVICE}/predict", {"inputs": [good, good, ["a"] * 64]})
    finally:
        raw.close()
    assert response.status_code == 422, response.text
    assert response.json()["details"]["field"] == "inputs[2][0]", response.text  # the very value: a string


# -- tenancy --------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_only_the_organisation_predicts_and_a_service_token_only_predicts(world: World, sklearn_model: Model) -> None:
    client = world.client()
    ready(client, 2)
    body = {"inputs": sklearn_model.expected["inputs"][:2]}
    path = f"/services/{SERVICE}"
    callers = {
        "other organisation": world.b["member"].api,
        "viewer": world.a["viewer"].api,
    }
    answers = {
        (who, what): api.request(method, url, json_body=payload).status_code
        for who, api in callers.items()
        for what, method, url, payload in (
            ("predict", "POST", f"{path}/predict", body),
            ("get", "GET", path, None),
            ("update", "PATCH", path, {"replicas": 1}),
            ("token", "POST", f"{path}/tokens", None),
        )
    }
    assert answers == {
        ("other organisation", "predict"): 404,
        ("other organisation", "get"): 404,
        ("other organisation", "update"): 404,
        ("other organisation", "token"): 404,
        ("viewer", "predict"): 403,
        ("viewer", "get"): 200,  # viewers read
        ("viewer", "update"): 403,
        ("viewer", "token"): 403,
    }

    token = client.service_token(SERVICE).token
    assert token is not None and token.startswith("kst.")
    with ServiceClient(world.server.url, token, service=SERVICE) as app:
        assert app.predict(body["inputs"]).outputs == sklearn_model.expected["outputs"][:2]
    bearer = Api(world.server.url, token=token, label="service token")
    try:
        assert bearer.post(f"{path}/predict", body).status_code == 200  # unsigned: the bearer token alone
        refused = {
            "get service": bearer.get(path).status_code,
            "list services": bearer.get("/services").status_code,
            "list jobs": bearer.get("/jobs").status_code,
            "update": bearer.request("PATCH", path, json_body={"replicas": 0}).status_code,
            "new token": bearer.post(f"{path}/tokens").status_code,
            "models": bearer.get("/models").status_code,
        }
    finally:
        bearer.close()
    assert all(status in (403, 404) for status in refused.values()), refused
    assert client.get_service(SERVICE).desired_replicas == 2  # nothing it tried changed anything


# -- changes under load ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_a_rolling_update_under_load_loses_no_request(world: World, sklearn_model: Model) -> None:
    client = world.client()
    before = ready(client, 2)
    # Version 2: the same files (stored once) under the next number, registered as another framework (the same
    # artifact again would answer version 1); the predictor loads it alike, the answers' model says which served.
    target = client.register_model("digits", sklearn_model.job_id, "model.joblib", framework="custom").version
    assert target > before.model_version
    with Load(world, sklearn_model.expected["inputs"][0]) as load:
        load.wait_answers(0.0, 20)
        updated = client.update_service(SERVICE, model=f"digits@{target}")
        assert updated.revision == before.revision + 1
        after = client.wait_service(SERVICE, revision=updated.revision, timeout=SETTLE)
        load.wait_answers(time.monotonic(), 20)
    assert load.failures == [], load.failures[:5]
    models = [model for _, model in load.answers]
    assert "digits@1" in models and f"digits@{target}" in models, "the load spanned the update"
    assert after.state == ServiceState.READY, after.message
    assert [(r.model_version, r.revision) for r in live(after)] == [(target, updated.revision)] * 2
    assert {client.predict(SERVICE, [x]).model for x in sklearn_model.expected["inputs"][:6]} == {f"digits@{target}"}


@pytest.mark.timeout(600)
def test_a_killed_replica_loses_no_request_and_comes_back(world: World, sklearn_model: Model) -> None:
    client = world.client()
    service = ready(client, 2)
    victim = live(service)[0]
    assert victim.job_id is not None
    process = serve_process(world.server, victim.job_id)
    with Load(world, sklearn_model.expected["inputs"][0]) as load:
        load.wait_answers(0.0, 20)
        killed_at = time.monotonic()
        process.kill()  # SIGKILL: no drain, the router finds out from a refused connection
        deadline = killed_at + SETTLE
        while True:  # back to 2 ready replicas, the killed one replaced
            service = client.get_service(SERVICE)
            ids = {r.id for r in live(service)}
            if victim.id not in ids and service.state == ServiceState.READY and service.ready_replicas == 2:
                break
            assert time.monotonic() < deadline, f"{service.state} {service.message}: {service.replicas}"
            time.sleep(0.2)
        load.wait_answers(time.monotonic(), 20)
    assert load.failures == [], load.failures[:5]
    assert len(load.answered_since(killed_at)) >= 20
    assert client.get_job(victim.job_id).state == JobState.FAILED
    assert len(live(service)) == 2
    assert [r.state for r in service.replicas if r.id == victim.id] == [ReplicaState.FAILED]  # shown a while


def canary_ready(client: Client, version: int) -> ServiceRead:
    """Until the service's canary (``version``) has a READY replica."""
    deadline = time.monotonic() + SETTLE
    while True:
        service = client.get_service(SERVICE)
        if any(r.canary and r.model_version == version and r.state == ReplicaState.READY for r in service.replicas):
            return service
        assert time.monotonic() < deadline, f"{service.state} {service.message}: {service.replicas}"
        time.sleep(0.2)


def until_answered(client: Client, model: str, **headers: Any) -> None:
    """Until a predict is answered by ``model`` (the API servers' split lookups are a second old at most)."""
    deadline = time.monotonic() + 30
    while client.predict(SERVICE, [[0.0] * 64], **headers).model != model:
        assert time.monotonic() < deadline, f"{model} never answered"


@pytest.mark.timeout(900)
def test_a_canary_answers_its_share_and_promote_and_rollback_lose_no_request(
    world: World, sklearn_model: Model
) -> None:
    client = world.client()
    stable = ready(client, 2).model_version
    # Another version of the same files: registered as a framework neither digits@1 (sklearn) nor the rolling
    # update's version (custom) was, or it would answer an existing number; the sklearn predictor loads it alike.
    canary = client.register_model("digits", sklearn_model.job_id, "model.joblib", framework="onnx").version
    assert canary != stable
    x = sklearn_model.expected["inputs"][0]
    with Load(world, x) as load:
        load.wait_answers(0.0, 10)
        # A canary with no share: only a predict that targets its version reaches it.
        started = client.update_service(SERVICE, model=f"digits@{canary}", canary=0)
        assert started.canary is not None and (started.canary.model_version, started.canary.weight) == (canary, 0)
        canary_ready(client, canary)
        assert client.predict(SERVICE, [x], version=canary).model == f"digits@{canary}"
        assert client.predict(SERVICE, [x], version=stable).model == f"digits@{stable}"
        # Half the predicts: a routing key reaches one version, every time.
        client.update_service(SERVICE, canary=50)
        until_answered(client, f"digits@{canary}")
        for key in ("alice", "bob", "carol", "dave"):
            assert len({client.predict(SERVICE, [x], routing_key=key).model for _ in range(5)}) == 1, key
        # Rolled back under the load: the canary's replica drains, the stable version answers everything.
        client.rollback_service(SERVICE)
        deadline = time.monotonic() + SETTLE
        while any(r.canary for r in live(client.get_service(SERVICE))):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        rolled_back = time.monotonic()
        load.wait_answers(rolled_back, 10)
        assert set(load.answered_since(rolled_back)) == {f"digits@{stable}"}
        # A canary again, promoted under the load: its replica stays, the old version's roll over.
        client.update_service(SERVICE, model=f"digits@{canary}", canary=10)
        canary_ready(client, canary)
        promoted = client.promote_service(SERVICE)
        assert (promoted.model_version, promoted.canary) == (canary, None)
        after = client.wait_service(SERVICE, revision=promoted.revision, timeout=SETTLE)
        done = time.monotonic()
        load.wait_answers(done, 10)
    assert load.failures == [], load.failures[:5]
    assert set(load.answered_since(done)) == {f"digits@{canary}"}
    assert after.state == ServiceState.READY, after.message
    assert [(r.model_version, r.canary) for r in live(after)] == [(canary, False)] * 2
    # What each version answered, in the service read (this server's router) and in /metrics (by track only).
    versions = {v.model_version: v for v in client.get_service(SERVICE).versions}
    assert versions[stable].requests > 0 and versions[canary].requests > 0 and versions[canary].role == "stable"
    metrics = httpx.get(world.server.url + "/metrics", timeout=30).text
    assert 'kiln_predict_track_requests_total{outcome="ok",track="canary"}' in metrics


@pytest.mark.timeout(600)
def test_scale_to_zero_then_a_request_waits_for_a_cold_start(world: World, sklearn_model: Model) -> None:
    client = world.client()
    ready(client, 2)
    client.scale_service(SERVICE, 0)
    idle = client.wait_service(SERVICE, ServiceState.IDLE, timeout=SETTLE)
    assert (idle.state, live(idle), idle.desired_replicas) == (ServiceState.IDLE, [], 0)
    answer = client.predict(SERVICE, sklearn_model.expected["inputs"][:4])  # waits for a replica to start
    assert answer.outputs == sklearn_model.expected["outputs"][:4]
    service = client.wait_service(SERVICE, timeout=SETTLE)
    assert (service.state, service.desired_replicas, service.ready_replicas) == (ServiceState.READY, 1, 1)
    assert len(live(service)) == 1


# -- the pytorch runtime --------------------------------------------------------------------------------------------


@pytest.mark.timeout(1500)
def test_torchscript_service_predicts_what_the_model_predicts(world: World, torch_model: Model) -> None:
    client = world.client()
    client.serve(service_spec("service_torch.yaml"))
    service = client.wait_service("digits-torch", timeout=300)
    assert service.state == ServiceState.READY, f"{service.message} {service.replicas}"
    try:
        inputs, expected = torch_model.expected["inputs"], torch_model.expected["outputs"]
        answer = client.predict("digits-torch", inputs)
        assert answer.model == "digits-torch@1"
        assert len(answer.outputs) == len(expected)
        for got, want in zip(answer.outputs, expected, strict=True):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
            assert got.index(max(got)) == want.index(max(want))
        # The declared input schema (64 float32s) refuses what the model would choke on.
        with pytest.raises(InvalidInput, match=r"inputs\[1\]"):
            client.predict("digits-torch", [inputs[0], inputs[1] + [0.0]])
    finally:
        client.delete_service("digits-torch")


# -- failures -------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_a_model_that_does_not_load_degrades_the_service_and_predict_gets_503(
    world: World, sklearn_model: Model
) -> None:
    client = world.client()
    # A job output that is no model, registered as one: the replica's joblib.load fails on it.
    client.register_model("not-a-model", sklearn_model.job_id, "expected.json", framework="sklearn")
    spec = service_spec("service_sklearn.yaml", name="broken", model="not-a-model@1", replicas=1, request_timeout=2)
    client.serve(spec)
    try:
        service = client.wait_service("broken", timeout=SETTLE)
        assert service.state == ServiceState.DEGRADED, f"{service.state}: {service.replicas}"
        loader = "kiln serve: cannot load model not-a-model@1 (sklearn) from /model: KeyError"
        assert service.message is not None and loader in service.message, service.message
        failed = [r for r in service.replicas if r.state == ReplicaState.FAILED]
        assert failed and loader in failed[0].message, service.replicas
        assert client.get_job(str(failed[0].job_id)).state == JobState.FAILED
        log = [line.text for line in client.service_logs("broken", replica=failed[0].id)]
        assert any(loader in text for text in log), log[-10:]
        raw = Api(world.server.url, world.a["member"].key_id, world.a["member"].secret)
        try:
            response = raw.post("/services/broken/predict", {"inputs": sklearn_model.expected["inputs"][:1]})
        finally:
            raw.close()
        assert response.status_code == 503, response.text
        assert int(response.headers["Retry-After"]) > 0
        assert client.get_service("broken").state == ServiceState.DEGRADED
    finally:
        client.delete_service("broken")
