"""Model services: a mixin of ``kiln.Client``. A service runs replicas of a predictor over one registered model
version (``kiln models register``) and answers ``predict`` through Kiln's router.

    service = client.serve({"name": "digits", "model": "digits@production", "predictor": {"type": "sklearn"},
                            "replicas": 2})
    client.wait_service("digits")                        # until every wanted replica is READY
    client.predict("digits", [[0.0] * 64]).outputs      # one output per instance
    client.update_service("digits", model="digits@4")    # rolled out one replica at a time
    token = client.service_token("digits").token         # for an application that may predict and nothing else
    ServiceClient(service.endpoint, token).predict([[0.0] * 64])

``client.services`` holds the same calls under shorter names (``client.services.list()``, ``.get(name)``, ...).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kiln.domain.idempotency import new_key
from kiln.domain.rollout import RolloutPolicy
from kiln.domain.serving import (
    PredictRequest,
    PredictResponse,
    ReplicaRead,
    ReplicaState,
    ServiceList,
    ServiceRead,
    ServiceSpec,
    ServiceState,
    ServiceSubmit,
    ServiceToken,
    ServiceUpdate,
)
from kiln.errors import KilnError, error_from_body
from kiln.sdk.logs import LogLine, LogParser
from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle
from kiln.sdk.transport import ClientTransport

if TYPE_CHECKING:
    import httpx

Progress = Callable[[int], None]
# What ``wait_service`` stops at besides the state it waits for: a replica failed (e.g. its model did not load),
# or the service is going away. Neither turns into the wanted state without a change from someone.
GIVE_UP_STATES = (ServiceState.DEGRADED, ServiceState.DELETING)
# Replicas that run or are about to: what a settled service has exactly its wanted number of, all of its revision.
LIVE_REPLICAS = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)
SERVICE_TOKEN_PREFIX = "kst."
PREDICT_SUFFIX = "/predict"
SERVICES_PATH = "/api/v1/services/"


def service_body(spec: ServiceSpec | dict[str, Any], code_sha256: str | None = None) -> dict[str, Any]:
    """The ``POST /services`` (and ``/services:render``) body; a bad spec is a ValidationError naming the field."""
    spec = spec if isinstance(spec, ServiceSpec) else ServiceSpec.model_validate(spec)
    return ServiceSubmit(spec=spec, code_sha256=code_sha256).model_dump(mode="json", by_alias=True, exclude_none=True)


def update_body(
    model: str | None = None,
    replicas: int | None = None,
    spec: ServiceSpec | dict[str, Any] | None = None,
    code_sha256: str | None = None,
    canary: int | None = None,
    canary_replicas: int | None = None,
    rollout: RolloutPolicy | dict[str, Any] | None = None,
    shadow: str | None = None,
) -> dict[str, Any]:
    """The ``PATCH /services/{name}`` body: only what changes; ValueError when nothing does."""
    if (model, replicas, spec, canary, canary_replicas, rollout, shadow) == (None,) * 7:
        raise ValueError("give model, replicas, spec, canary, rollout or shadow: an update with nothing to change")
    if rollout is not None and not isinstance(rollout, RolloutPolicy):
        rollout = RolloutPolicy.model_validate(rollout)
    if spec is not None and not isinstance(spec, ServiceSpec):
        spec = ServiceSpec.model_validate(spec)
    update = ServiceUpdate(
        model=model,
        replicas=replicas,
        spec=spec,
        code_sha256=code_sha256,
        canary=canary,
        canary_replicas=canary_replicas,
        rollout=rollout,
        shadow=shadow,
    )
    return update.model_dump(mode="json", by_alias=True, exclude_none=True)


def predict_body(inputs: Any, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``PredictRequest`` body. ``inputs`` is a list of instances; an array with ``tolist()`` (numpy, torch) is
    turned into one, so that ``client.predict(name, x_test[:8])`` works."""
    if hasattr(inputs, "tolist"):
        inputs = inputs.tolist()
    if isinstance(inputs, tuple):
        inputs = list(inputs)
    request = PredictRequest(inputs=inputs, parameters=parameters or {})
    return request.model_dump(mode="json")


def parse_logs(text: str) -> list[LogLine]:
    """The stored log lines of a replica's job (``<time> <O|E|K> <text>``, as ``/jobs/{id}/logs`` serves them)."""
    parser = LogParser()
    return [parser.parse(line) for line in text.split("\n") if line]


def failed_rollout(service: ServiceRead, revision: int) -> list[ReplicaRead]:
    """The replicas of ``revision`` (or later) that failed before they were ever ready: during a rolling update
    the service stays UPDATING (its old replicas answer) while such a replica is started again with a growing
    back-off, so this, not the service's state, says that the new version does not come up (e.g. does not load)."""
    return [
        r for r in service.replicas if r.revision >= revision and r.state is ReplicaState.FAILED and r.ready_at is None
    ]


def settled(service: ServiceRead, wanted: ServiceState, revision: int | None = None) -> bool:
    """Whether ``service`` is where ``wait_service`` waits for it: in ``wanted``, at ``revision`` or later, and
    for READY (IDLE) with exactly its desired replicas live and ready (none), every one of that revision. A rolling
    update's old replicas still draining, or a scale-down's, keep it unsettled. The replica checks apply only
    where the server lists the replicas."""
    if service.state is not wanted or (revision is not None and service.revision < revision):
        return False
    live = [r for r in service.replicas if r.state in LIVE_REPLICAS]
    if not service.replicas or wanted not in (ServiceState.READY, ServiceState.IDLE):
        return True
    if revision is not None and any(r.revision < revision for r in live):
        return False
    if wanted is ServiceState.IDLE:
        return not live
    return len(live) == service.desired_replicas and all(r.state is ReplicaState.READY for r in live)


def _path(name: str) -> str:
    return f"/services/{quote(name, safe='')}"


class ServicesMixin(ClientTransport):
    """The service methods of ``kiln.Client``."""

    if TYPE_CHECKING:

        def upload_blob(self, path: Path, sha256: str, progress: Progress | None = None) -> None: ...

    @property
    def services(self) -> Services:
        """The same calls under shorter names: ``client.services.list()``, ``.get(name)``, ``.scale(name, 2)``..."""
        return Services(self)

    def submit_service(
        self, spec: ServiceSpec | dict[str, Any], code_sha256: str | None = None, *, idempotency_key: str | None = None
    ) -> ServiceRead:
        """Create a service whose custom predictor comes from the code bundle ``code_sha256`` (uploaded already,
        see ``serve``). Sent with ``idempotency_key`` (by default a new one per call) and retried with it: a retry
        answers the service the first try created, not a 409."""
        body = service_body(spec, code_sha256)
        key = new_key() if idempotency_key is None else idempotency_key
        return ServiceRead.model_validate(self.request("POST", "/services", json_body=body, idempotency_key=key).json())

    def upload_service_code(
        self, code_dir: Path, *, max_bytes: int = DEFAULT_MAX_CODE_BYTES, progress: Progress | None = None
    ) -> str:
        """Pack ``code_dir`` as ``run`` does (honouring .gitignore/.kilnignore), upload it unless the server has
        it, and return its sha256."""
        bundle = build_bundle(code_dir, max_bytes)
        try:
            self.upload_blob(bundle.path, bundle.sha256, progress)
        finally:
            bundle.path.unlink(missing_ok=True)
        return bundle.sha256

    def serve(
        self,
        spec: ServiceSpec | dict[str, Any],
        code_dir: Path | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
        progress: Progress | None = None,
        idempotency_key: str | None = None,
    ) -> ServiceRead:
        """Create a service (``spec``: a ServiceSpec or the mapping of a service.yaml). Only a ``custom``
        predictor needs code: ``code_dir`` is then packed and uploaded (if the server lacks it); a built-in
        predictor (torchscript, torch-export, onnx, sklearn) loads the model version alone and ``code_dir`` is
        not read. Returns at once, in DEPLOYING; ``wait_service`` waits for its replicas. ``idempotency_key``: as
        for ``submit_service``."""
        spec = spec if isinstance(spec, ServiceSpec) else ServiceSpec.model_validate(spec)
        if spec.predictor.type != "custom":
            return self.submit_service(spec, idempotency_key=idempotency_key)
        if code_dir is None:
            raise ValueError(
                f"code_dir: a custom predictor ({spec.predictor.class_}) is imported from a code bundle; "
                "give the directory that holds its module"
            )
        sha256 = self.upload_service_code(code_dir, max_bytes=max_bytes, progress=progress)
        return self.submit_service(spec, sha256, idempotency_key=idempotency_key)

    def list_services(self) -> list[ServiceRead]:
        """The services of your organisation."""
        return ServiceList.model_validate(self.request("GET", "/services").json()).items

    def get_service(self, name: str) -> ServiceRead:
        """A service with its replicas (state, job, model version, requests in flight)."""
        return ServiceRead.model_validate(self.request("GET", _path(name)).json())

    def update_service(
        self,
        name: str,
        model: str | None = None,
        replicas: int | None = None,
        *,
        spec: ServiceSpec | dict[str, Any] | None = None,
        code_dir: Path | None = None,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
        progress: Progress | None = None,
        canary: int | None = None,
        canary_replicas: int | None = None,
        rollout: RolloutPolicy | dict[str, Any] | None = None,
        shadow: str | None = None,
    ) -> ServiceRead:
        """Change a service: ``model`` (NAME@VERSION or NAME@ALIAS) or a whole new ``spec`` is rolled out one
        replica at a time (a new replica is ready before an old one drains); ``replicas`` scales at once. A new
        spec with a custom predictor takes its code from ``code_dir``, uploaded as ``serve`` does. ``model`` with
        ``canary`` (a percentage, 0 to 100) runs that version beside the stable one with that share of the predicts
        (``canary_replicas`` replicas, default 1); ``canary`` alone changes a running canary's share. ``rollout``
        (a RolloutPolicy or its dict: max_error_rate, max_p99_ms, min_requests, steps, step_wait) lets the server
        advance the canary through its steps, promote it at 100 and roll it back when it breaks a bound.
        ``shadow`` (NAME@VERSION) sends a copy of the predicts to that version, its answers compared with the
        ones returned and never returned themselves (``""`` ends it)."""
        code_sha256 = None
        if code_dir is not None:
            if spec is None:
                raise ValueError("code_dir: new code comes with a new spec (spec=...)")
            code_sha256 = self.upload_service_code(code_dir, max_bytes=max_bytes, progress=progress)
        body = update_body(model, replicas, spec, code_sha256, canary, canary_replicas, rollout, shadow)
        return ServiceRead.model_validate(self.request("PATCH", _path(name), json_body=body).json())

    def promote_service(self, name: str) -> ServiceRead:
        """Make the canary the stable version: its replicas go on answering, the old version's are rolled over
        one at a time (no request is dropped). Conflict when the service runs no canary."""
        return ServiceRead.model_validate(self.request("POST", f"{_path(name)}/promote").json())

    def rollback_service(self, name: str) -> ServiceRead:
        """End the canary: predicts go to the stable version only and the canary's replicas drain (those in
        flight finish). Conflict when the service runs no canary."""
        return ServiceRead.model_validate(self.request("POST", f"{_path(name)}/rollback").json())

    def scale_service(self, name: str, replicas: int) -> ServiceRead:
        """Run ``replicas`` replicas (0: none, until scaled up again). A service with ``autoscale`` scales
        itself: the server refuses this."""
        return self.update_service(name, replicas=replicas)

    def delete_service(self, name: str) -> None:
        """Delete a service: its replicas are stopped and its tokens stop working."""
        self.request("DELETE", _path(name))

    def service_token(self, name: str) -> ServiceToken:
        """A new token that can predict with this service and do nothing else; ``.token`` (``kst.<id>.<secret>``)
        is shown this once. Send it as ``Authorization: Bearer <token>``, or use ``ServiceClient``."""
        return ServiceToken.model_validate(self.request("POST", f"{_path(name)}/tokens").json())

    def render_service(
        self, spec: ServiceSpec | dict[str, Any], code_sha256: str | None = None
    ) -> list[dict[str, Any]]:
        """The Kubernetes objects this spec becomes (a Secret, a ConfigMap, a Deployment, a Service, and a
        HorizontalPodAutoscaler with ``autoscale``), as the server renders them with its model registry and
        runtime catalog; ``code_sha256``: the bundle a custom predictor's pods would fetch. Nothing is created."""
        data = self.request("POST", "/services:render", json_body=service_body(spec, code_sha256)).json()
        manifests: list[dict[str, Any]] = data["manifests"]
        return manifests

    def predict(
        self,
        name: str,
        inputs: Any,
        parameters: dict[str, Any] | None = None,
        *,
        version: int | None = None,
        routing_key: str | None = None,
    ) -> PredictResponse:
        """The service's outputs for ``inputs`` (a list of instances, one output each), and the ``model``
        (NAME@VERSION) that answered. An instance the predictor's input schema refuses is an InvalidInput naming
        it (``inputs[3]: ...``); no replica ready is Unavailable (the server says when to retry). ``version``: only
        that model version of the service answers (the stable or the canary's, whatever its share);
        ``routing_key``: the same key always reaches the same version while the split stays."""
        headers = {}
        if version is not None:
            headers["X-Kiln-Model-Version"] = str(version)
        if routing_key is not None:
            headers["X-Kiln-Routing-Key"] = routing_key
        response = self.request(
            "POST",
            f"{_path(name)}/predict",
            json_body=predict_body(inputs, parameters),
            extra_headers=headers or None,
        )
        return PredictResponse.model_validate(response.json())

    def service_logs(self, name: str, replica: str | None = None, offset: int = 0) -> list[LogLine]:
        """A replica's log (its job's) from byte ``offset``: the newest replica's, or with ``replica`` that one's
        (its id as ``get_service`` lists it)."""
        response = self.request("GET", f"{_path(name)}/logs", params={"replica": replica, "offset": offset or None})
        return parse_logs(response.text)

    def wait_service(
        self,
        name: str,
        state: ServiceState | str = ServiceState.READY,
        timeout: float | None = 600.0,
        poll: float = 1.0,
        *,
        revision: int | None = None,
        give_up_on: Collection[ServiceState | str] = GIVE_UP_STATES,
    ) -> ServiceRead:
        """Block until the service is in ``state`` (default READY: its desired replicas all ready, none other
        running or draining) and return it; with ``revision`` (``update_service``'s answer's) until every replica
        is of that revision, i.e. the rolling update is done. It also returns once the service is in one of
        ``give_up_on`` (default DEGRADED, DELETING: a replica failed, e.g. its model did not load — the replicas'
        ``message`` says why) or, with ``revision``, once a replica of that revision failed before it was ever
        ready (``failed_rollout``); so check ``settled(...)`` or ``.state``. TimeoutError after ``timeout`` seconds
        (None: no limit)."""
        wanted = ServiceState(state)
        stop = {ServiceState(s) for s in give_up_on} - {wanted}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            service = self.get_service(name)
            if settled(service, wanted, revision) or service.state in stop:
                return service
            if revision is not None and failed_rollout(service, revision):
                return service
            if deadline is not None and time.monotonic() > deadline:
                ready = f"{service.ready_replicas}/{service.desired_replicas} replicas ready"
                raise TimeoutError(f"service {name} still {service.state} after {timeout}s ({ready})")
            time.sleep(poll)


class Services:
    """``client.services``: the service calls of ``kiln.Client`` under shorter names."""

    def __init__(self, client: ServicesMixin) -> None:
        self._client = client

    def create(
        self, spec: ServiceSpec | dict[str, Any], code_dir: Path | None = None, *, idempotency_key: str | None = None
    ) -> ServiceRead:
        """``client.serve``."""
        return self._client.serve(spec, code_dir, idempotency_key=idempotency_key)

    def list(self) -> builtins.list[ServiceRead]:
        return self._client.list_services()

    def get(self, name: str) -> ServiceRead:
        return self._client.get_service(name)

    def update(self, name: str, model: str | None = None, replicas: int | None = None) -> ServiceRead:
        return self._client.update_service(name, model, replicas)

    def scale(self, name: str, replicas: int) -> ServiceRead:
        return self._client.scale_service(name, replicas)

    def promote(self, name: str) -> ServiceRead:
        return self._client.promote_service(name)

    def rollback(self, name: str) -> ServiceRead:
        return self._client.rollback_service(name)

    def delete(self, name: str) -> None:
        self._client.delete_service(name)

    def token(self, name: str) -> ServiceToken:
        return self._client.service_token(name)

    def render(self, spec: ServiceSpec | dict[str, Any]) -> builtins.list[dict[str, Any]]:
        return self._client.render_service(spec)

    def predict(self, name: str, inputs: Any, parameters: dict[str, Any] | None = None) -> PredictResponse:
        return self._client.predict(name, inputs, parameters)

    def logs(self, name: str, replica: str | None = None) -> builtins.list[LogLine]:
        return self._client.service_logs(name, replica)

    def wait(
        self, name: str, state: ServiceState | str = ServiceState.READY, timeout: float | None = 600.0
    ) -> ServiceRead:
        return self._client.wait_service(name, state, timeout)


def predict_url(endpoint: str, service: str | None = None) -> str:
    """Where ``ServiceClient`` posts: the service's own endpoint (``ServiceRead.endpoint``, ending in
    ``/api/v1/services/NAME/predict``) as given, or with ``service`` the Kiln server's URL plus that service's
    predict path."""
    endpoint = endpoint.rstrip("/")
    if service is not None:
        if SERVICES_PATH in endpoint + "/":
            raise ValueError(f"endpoint: give the Kiln server's URL with service=, not a service's ({endpoint})")
        return f"{endpoint}{SERVICES_PATH}{quote(service, safe='')}{PREDICT_SUFFIX}"
    if SERVICES_PATH not in endpoint or not endpoint.startswith(("http://", "https://")):
        raise ValueError(
            f"endpoint: {endpoint!r} is not a service's endpoint (http(s)://HOST/api/v1/services/NAME/predict); "
            "give the Kiln server's URL and service=NAME instead"
        )
    return endpoint if endpoint.endswith(PREDICT_SUFFIX) else endpoint + PREDICT_SUFFIX


class ServiceClient:
    """Predicts with a service token (``kiln services token NAME``), for an application that should be able to
    call one service and nothing else: no access key, no signature, just ``Authorization: Bearer kst.…``.

        client = ServiceClient("https://kiln.example.com/api/v1/services/digits/predict", token)
        client = ServiceClient("https://kiln.example.com", token, service="digits")   # the same
        client.predict([[0.0] * 64]).outputs

    Errors are the ``kiln.errors`` classes the server maps (InvalidInput naming the instance, Unavailable with no
    replica ready, NotFound for a token that is not this service's).
    """

    def __init__(self, endpoint: str, token: str, service: str | None = None, *, timeout: float = 60.0) -> None:
        if not token.startswith(SERVICE_TOKEN_PREFIX) or token.count(".") != 2:
            raise ValueError("token: expected a service token kst.<id>.<secret> (from kiln services token NAME)")
        import httpx

        self.url = predict_url(endpoint, service)
        self._token = token
        self._http: httpx.Client = httpx.Client(timeout=timeout)

    def __repr__(self) -> str:  # never show the token
        return f"ServiceClient(url={self.url!r})"

    def predict(self, inputs: Any, parameters: dict[str, Any] | None = None) -> PredictResponse:
        """The outputs for ``inputs`` (a list of instances) and the ``model`` (NAME@VERSION) that answered."""
        import httpx

        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            response = self._http.post(self.url, json=predict_body(inputs, parameters), headers=headers)
        except httpx.TransportError as exc:
            raise KilnError(f"cannot reach {self.url}: {exc}") from exc
        _raise_for(response)
        return PredictResponse.model_validate(response.json())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = response.text
    raise error_from_body(response.status_code, body)
