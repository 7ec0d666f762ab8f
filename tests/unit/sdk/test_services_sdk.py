"""The SDK's service calls against a recording httpx transport (no server): the bodies and paths each call sends,
code packed only for a custom predictor, errors mapped to ``kiln.errors``, ``wait_service`` stopping on a failed
replica, and ``ServiceClient`` predicting with a service token and nothing else."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from kiln.auth import signing
from kiln.domain.serving import ServiceRead, ServiceState
from kiln.errors import InvalidInput, NotFound, Unavailable
from kiln.sdk.client import Client
from kiln.sdk.services import (
    ServiceClient,
    Services,
    ServicesMixin,
    failed_rollout,
    predict_url,
    service_body,
    settled,
)

NOW = "2026-12-02T09:00:00Z"
SPEC: dict[str, Any] = {
    "name": "digits",
    "model": "digits@production",
    "predictor": {"type": "sklearn", "input_schema": {"shape": [64]}},
    "replicas": 2,
    "batching": {"max_batch_size": 16, "max_latency_ms": 2},
}
CUSTOM = {**SPEC, "predictor": {"type": "custom", "class": "predictor:Model"}}
TOKEN = "kst.tok-1.c2VjcmV0"


def service_json(state: str = "READY", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "svc-1",
        "name": "digits",
        "org_id": "org-1",
        "user_id": "usr-1",
        "state": state,
        "spec": service_body(SPEC)["spec"],
        "model_name": "digits",
        "model_version": 3,
        "revision": 1,
        "desired_replicas": 2,
        "ready_replicas": 2 if state == "READY" else 0,
        "replicas": [],
        "endpoint": "http://kiln.test/api/v1/services/digits/predict",
        "created_at": NOW,
        "updated_at": NOW,
    }
    return base | fields


Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """Answers each request with ``handler`` and keeps it (and its body) for the test to read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.handler(request)

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.url.path) for r in self.requests]

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


def answer(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if body is None:
            return httpx.Response(status, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return handler


@pytest.fixture
def connect() -> Iterator[Callable[[Handler], tuple[Client, Recorder]]]:
    clients: list[Client] = []

    def make(handler: Handler) -> tuple[Client, Recorder]:
        recorder = Recorder(handler)
        client = Client("http://kiln.test", "AKTESTTESTTESTTEST00", "s3cret")
        client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(recorder))
        clients.append(client)
        return client, recorder

    yield make
    for client in clients:
        client.close()


def test_the_submit_body_sends_class_by_its_yaml_name_and_a_bad_spec_names_the_field() -> None:
    body = service_body(CUSTOM, "a" * 64)
    assert body["spec"]["predictor"] == {"type": "custom", "class": "predictor:Model", "method": "predict"}
    assert body["code_sha256"] == "a" * 64
    with pytest.raises(ValidationError, match="min: 3 is above max"):
        service_body({**SPEC, "autoscale": {"min": 3, "max": 2}})
    with pytest.raises(ValidationError, match="class: a custom predictor needs class"):
        service_body({**SPEC, "predictor": {"type": "custom"}})
    with pytest.raises(ValidationError, match="expected NAME@VERSION or NAME@ALIAS"):
        service_body({**SPEC, "model": "digits"})


def test_a_built_in_predictor_is_served_without_packing_or_uploading_code(connect, tmp_path: Path) -> None:
    client, recorder = connect(answer(201, service_json("DEPLOYING")))
    service = client.serve(SPEC, code_dir=tmp_path / "not-read")
    assert service.state is ServiceState.DEPLOYING and service.model_version == 3
    assert recorder.calls() == [("POST", "/api/v1/services")]
    body = recorder.body()
    assert "code_sha256" not in body and body["spec"]["batching"] == {"max_batch_size": 16, "max_latency_ms": 2.0}


def test_a_custom_predictor_packs_and_uploads_its_code_once_then_names_the_bundle(connect, tmp_path: Path) -> None:
    (tmp_path / "predictor.py").write_text("class Model:\n    pass\n")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD":
            return httpx.Response(404)
        if request.method == "PUT":
            return httpx.Response(201, json={})
        return httpx.Response(201, json=service_json("DEPLOYING"))

    client, recorder = connect(handler)
    client.serve(CUSTOM, code_dir=tmp_path)
    (head, head_path), (put, put_path), post = recorder.calls()
    sha = head_path.rsplit("/", 1)[1]
    assert (head, put, put_path) == ("HEAD", "PUT", f"/api/v1/blobs/{sha}") and len(sha) == 64
    assert post == ("POST", "/api/v1/services") and recorder.body()["code_sha256"] == sha
    assert recorder.requests[1].content[:2] == b"\x1f\x8b"  # the bundle itself, gzip

    with pytest.raises(ValueError, match=r"code_dir: a custom predictor \(predictor:Model\)"):
        client.serve(CUSTOM)
    assert len(recorder.requests) == 3  # refused here, before any request


def test_update_and_scale_send_only_what_changes(connect) -> None:
    client, recorder = connect(answer(200, service_json("UPDATING")))
    client.update_service("digits", model="digits@4")
    assert recorder.calls()[-1] == ("PATCH", "/api/v1/services/digits") and recorder.body() == {"model": "digits@4"}
    client.scale_service("digits", 0)
    assert recorder.body() == {"replicas": 0}
    client.services.update("digits", replicas=3)
    assert recorder.body() == {"replicas": 3}
    with pytest.raises(ValueError, match="nothing to change"):
        client.update_service("digits")
    with pytest.raises(ValidationError, match="expected NAME@VERSION"):
        client.update_service("digits", model="digits 4")
    with pytest.raises(ValueError, match="code_dir: new code comes with a new spec"):
        client.update_service("digits", model="digits@4", code_dir=Path("."))
    assert len(recorder.requests) == 3


def test_predict_sends_the_instances_and_reads_the_outputs_and_the_model_that_answered(connect) -> None:
    client, recorder = connect(answer(200, {"outputs": [3, 7], "model": "digits@3"}))

    class Array:  # what numpy and torch arrays offer
        def tolist(self) -> list[list[float]]:
            return [[0.0, 1.0], [2.0, 3.0]]

    reply = client.predict("digits", Array(), parameters={"top_k": 2})
    assert reply.outputs == [3, 7] and reply.model == "digits@3"
    assert recorder.calls() == [("POST", "/api/v1/services/digits/predict")]
    assert recorder.body() == {"inputs": [[0.0, 1.0], [2.0, 3.0]], "parameters": {"top_k": 2}}
    assert signing.parse_authorization(recorder.requests[0].headers["authorization"]) is not None  # signed
    client.predict("digits", ([1], [2]))
    assert recorder.body() == {"inputs": [[1], [2]], "parameters": {}}


def test_a_refused_instance_and_no_ready_replica_are_the_servers_error_classes(connect) -> None:
    refusal = {
        "code": "invalid_input",
        "message": "inputs[3]: expected 64 numbers, got 10",
        "details": {"field": "inputs[3]"},
    }
    client, _ = connect(answer(422, refusal))
    with pytest.raises(InvalidInput, match=r"inputs\[3\]: expected 64 numbers") as caught:
        client.predict("digits", [[0.0] * 64] * 4)
    assert caught.value.details == {"field": "inputs[3]"}
    busy = {"code": "unavailable", "message": "service digits has no ready replica"}
    client, _ = connect(answer(503, busy, headers={"Retry-After": "2"}))
    with pytest.raises(Unavailable, match="no ready replica"):
        client.predict("digits", [[0.0] * 64])


def test_render_is_a_signed_post_to_the_colon_path_and_returns_the_manifests(connect) -> None:
    manifests = [{"kind": "Deployment"}, {"kind": "Service"}]
    client, recorder = connect(answer(200, {"manifests": manifests}))
    assert client.render_service(SPEC) == manifests
    request = recorder.requests[0]
    assert (request.method, request.url.raw_path) == ("POST", b"/api/v1/services:render")
    assert recorder.body()["spec"]["name"] == "digits"
    # The signature covers the path as sent: the server recomputes it from the same bytes.
    key, sig = signing.parse_authorization(request.headers["authorization"]) or ("", "")
    text = signing.string_to_sign(
        "POST",
        request.url.raw_path.decode(),
        "",
        request.headers[signing.HEADER_DATE],
        request.headers[signing.HEADER_NONCE],
        signing.body_sha256(request.content),
    )
    assert key == "AKTESTTESTTESTTEST00" and signing.signatures_equal(sig, signing.signature("s3cret", text))


def test_tokens_delete_list_and_logs(connect) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/tokens"):
            return httpx.Response(201, json={"id": "tok-1", "service": "digits", "token": TOKEN, "created_at": NOW})
        if path.endswith("/logs"):
            text = "2026-12-02T09:00:00.000000Z K attempt 1 starting\n2026-12-02T09:00:01.000000Z E serving digits@3\n"
            return httpx.Response(200, text=text)
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, json={"items": [service_json()]})

    client, recorder = connect(handler)
    assert client.service_token("digits").token == TOKEN
    client.delete_service("digits")
    assert [s.name for s in client.list_services()] == ["digits"]
    lines = client.service_logs("digits", replica="rep-2")
    assert [(line.source.value, line.text, line.attempt) for line in lines] == [
        ("kiln", "attempt 1 starting", 1),
        ("stderr", "serving digits@3", 1),
    ]
    assert recorder.calls() == [
        ("POST", "/api/v1/services/digits/tokens"),
        ("DELETE", "/api/v1/services/digits"),
        ("GET", "/api/v1/services"),
        ("GET", "/api/v1/services/digits/logs"),
    ]
    assert recorder.requests[-1].url.params["replica"] == "rep-2"


class ScriptedServices(ServicesMixin):
    """``get_service`` answers from a script, one state per poll: ``wait_service``'s logic without a server."""

    def __init__(self, states: list[str], replicas: list[list[dict[str, Any]]] | None = None) -> None:
        self.states = states
        self.replicas = replicas or [[] for _ in states]
        self.polls = 0

    def get_service(self, name: str) -> ServiceRead:
        step = min(self.polls, len(self.states) - 1)
        self.polls += 1
        return ServiceRead.model_validate(service_json(self.states[step], replicas=self.replicas[step], revision=2))


def test_wait_returns_at_the_wanted_state_or_at_a_failed_replica_and_times_out_otherwise() -> None:
    scripted = ScriptedServices(["DEPLOYING", "DEPLOYING", "READY"])
    assert scripted.wait_service("digits", poll=0).state is ServiceState.READY and scripted.polls == 3
    scripted = ScriptedServices(["DEPLOYING", "DEGRADED", "READY"])
    assert scripted.wait_service("digits", poll=0).state is ServiceState.DEGRADED and scripted.polls == 2
    # Waiting for DEGRADED itself is allowed: it is then the goal, not a reason to stop.
    scripted = ScriptedServices(["READY", "DEGRADED"])
    assert scripted.wait_service("digits", "DEGRADED", poll=0).state is ServiceState.DEGRADED
    scripted = ScriptedServices(["UPDATING", "IDLE"])
    assert scripted.wait_service("digits", ServiceState.IDLE, poll=0, give_up_on=()).state is ServiceState.IDLE
    with pytest.raises(TimeoutError, match=r"still DEPLOYING after 0s \(0/2 replicas ready\)"):
        ScriptedServices(["DEPLOYING"]).wait_service("digits", timeout=0, poll=0)


def replica(state: str, revision: int = 1) -> dict[str, Any]:
    return {
        "id": f"rep-{state}-{revision}",
        "revision": revision,
        "state": state,
        "model_version": 3,
        "created_at": NOW,
    }


@pytest.mark.parametrize(
    ("state", "at", "replicas", "wanted", "revision", "expected"),
    [
        ("READY", 1, [replica("READY"), replica("READY")], "READY", None, True),
        ("READY", 1, [], "READY", None, True),  # no replicas listed: the server's word
        # A rolling update to revision 2: an old replica still draining, or any old one left, is not done.
        ("READY", 2, [replica("READY", 2), replica("READY", 2), replica("DRAINING", 1)], "READY", 2, False),
        ("READY", 2, [replica("READY", 2), replica("READY", 1)], "READY", 2, False),
        ("READY", 2, [replica("READY", 2), replica("READY", 2), replica("STOPPED", 1)], "READY", 2, True),
        ("READY", 1, [replica("READY"), replica("READY")], "READY", 2, False),  # the update not yet recorded
        # A scale-down to 2 with a third replica still draining; a scale-up with one still starting.
        ("READY", 1, [replica("READY"), replica("READY"), replica("DRAINING")], "READY", None, False),
        ("READY", 1, [replica("READY"), replica("STARTING")], "READY", None, False),
        ("READY", 1, [replica("READY"), replica("READY"), replica("FAILED")], "READY", None, True),
        ("IDLE", 1, [replica("DRAINING")], "IDLE", None, False),
        ("IDLE", 1, [replica("STOPPED"), replica("STOPPED")], "IDLE", None, True),
        ("DEPLOYING", 1, [replica("STARTING")], "READY", None, False),
    ],
)
def test_a_service_is_settled_in_its_state_with_its_replicas_of_its_revision(
    state: str, at: int, replicas: list[dict[str, Any]], wanted: str, revision: int | None, expected: bool
) -> None:
    service = ServiceRead.model_validate(service_json(state, replicas=replicas, revision=at))
    assert settled(service, ServiceState(wanted), revision) is expected


def test_waiting_for_a_rollout_stops_at_a_new_replica_that_failed_before_it_was_ready() -> None:
    loading = [replica("READY", 1), replica("READY", 1), replica("STARTING", 2)]
    broken = [replica("READY", 1), replica("READY", 1), replica("FAILED", 2) | {"message": "cannot load model"}]
    scripted = ScriptedServices(["UPDATING", "UPDATING", "UPDATING"], [loading, broken, loading])
    service = scripted.wait_service("digits", poll=0, revision=2)
    assert service.state is ServiceState.UPDATING and scripted.polls == 2
    assert [r.message for r in failed_rollout(service, 2)] == ["cannot load model"]
    # An old revision's failure, or a new replica that was ready once (it crashed later: replaced), is no verdict.
    crashed = replica("FAILED", 2) | {"ready_at": NOW}
    assert failed_rollout(service.model_copy(update={"replicas": [*service.replicas[:2]]}), 2) == []
    later = ServiceRead.model_validate(service_json("UPDATING", replicas=[replica("FAILED", 1), crashed]))
    assert failed_rollout(later, 2) == []


def test_client_services_is_the_same_calls_under_shorter_names() -> None:
    client = Client("http://127.0.0.1:9", "AK", "SK")
    try:
        assert isinstance(client.services, Services)
        names = {"create", "list", "get", "update", "scale", "delete", "token", "render", "predict", "logs", "wait"}
        assert names <= set(dir(client.services))
    finally:
        client.close()


def test_a_service_client_predicts_with_the_bearer_token_and_no_signature() -> None:
    recorder = Recorder(answer(200, {"outputs": [1], "model": "digits@3"}))
    with ServiceClient("https://kiln.test/api/v1/services/digits/predict", TOKEN) as client:
        client._http = httpx.Client(transport=httpx.MockTransport(recorder))
        assert client.predict([[0.0] * 64]).outputs == [1]
        assert TOKEN not in repr(client)
    request = recorder.requests[0]
    assert str(request.url) == "https://kiln.test/api/v1/services/digits/predict"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert not {h.lower() for h in (signing.HEADER_DATE, signing.HEADER_NONCE, signing.HEADER_CONTENT)} & set(
        request.headers
    )
    assert recorder.body() == {"inputs": [[0.0] * 64], "parameters": {}}

    refused = Recorder(answer(404, {"code": "not_found", "message": "service digits not found"}))
    with ServiceClient("https://kiln.test", TOKEN, service="digits") as client:
        client._http = httpx.Client(transport=httpx.MockTransport(refused))
        with pytest.raises(NotFound, match="service digits not found"):
            client.predict([[0.0]])


@pytest.mark.parametrize(
    ("endpoint", "service", "url"),
    [
        ("https://kiln.test/api/v1/services/digits/predict", None, "https://kiln.test/api/v1/services/digits/predict"),
        ("https://kiln.test/api/v1/services/digits/", None, "https://kiln.test/api/v1/services/digits/predict"),
        ("https://kiln.test/", "digits", "https://kiln.test/api/v1/services/digits/predict"),
        ("http://10.0.0.5:8080/kiln", "a-b", "http://10.0.0.5:8080/kiln/api/v1/services/a-b/predict"),
    ],
)
def test_the_predict_url_comes_from_a_services_endpoint_or_the_server_and_a_name(
    endpoint: str, service: str | None, url: str
) -> None:
    assert predict_url(endpoint, service) == url


def test_a_service_client_refuses_what_is_not_a_service_token_or_endpoint() -> None:
    with pytest.raises(ValueError, match="token: expected a service token kst"):
        ServiceClient("https://kiln.test", "AKSOMETHING", service="digits")
    with pytest.raises(ValueError, match=r"endpoint: 'https://kiln\.test' is not a service's endpoint"):
        ServiceClient("https://kiln.test", TOKEN)
    with pytest.raises(ValueError, match="endpoint: give the Kiln server's URL with service="):
        predict_url("https://kiln.test/api/v1/services/digits/predict", "digits")
