"""Property-based tests of the whole API against its own OpenAPI schema (schemathesis), on a real server.

Every operation is called with generated input: valid (positive) and invalid (negative) values, the boundary
cases of every bound (schemathesis' coverage phase: a string one over its maxLength, an integer one over its
maximum, ...), and sequences that follow the links between operations (create a job, then read, cancel and list
it; open an upload, then send parts and complete it; create a draft, then commit it). Every request is signed
like the SDK's (kiln.auth.signing), as the admin of a fresh server. A test fails on any 5xx, on a status the
operation does not declare, on a body, content type or header that does not match the schema, on invalid input
that is accepted, and on a 405 without an Allow header.

The server is set up so that fuzzing does no harm and is not throttled: no rate limit, one CPU to schedule, held
by a job that never ends (a "blocker": nothing the fuzzer submits ever starts, so no generated command runs, and a
reaper cancels what it submits so that following a job's log ends), and no preemption. Requests that would lock
the test out are sent to decoys instead (see ``Guard``).

Checks left out, with why:
- positive_data_acceptance (input that matches the schema must get a 2xx): the schema cannot state every rule
  (a dataset name of the right length with an upper-case letter or '..', a runtime that is not in the catalog,
  ids of things that do not exist, a part that is not the size of the session's parts), so input the schema
  allows is rightly refused with a 4xx that the operation declares.
- ignored_auth: the KILN-HMAC-SHA256 signature is not an OpenAPI security scheme, so schemathesis cannot send a
  request without it; unsigned, tampered and replayed requests are tests/integration/api/test_auth.py's.
- object_level_authorization: needs a second tenant's credentials; the cross-organisation matrix of every route is
  tests/integration/tenancy/test_isolation_matrix.py.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from schemathesis.generation.stateful.state_machine import APIStateMachine, StepInput, StepOutput

from kiln.api.app import create_app
from kiln.api.auth import STREAMED_UPLOAD
from kiln.auth import signing
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.errors import KilnError
from tests.integration.conftest import pytest_collection_modifyitems
from tests.kilnserver import KilnServer

# Every catalog framework but the bare one: a fuzzed install of these would build gigabytes of wheels.
HEAVY_FRAMEWORKS = frozenset(DEFAULT_CATALOG.frameworks()) - {"python"}

RAW_SCHEMA = create_app().openapi()
CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {"mode": "all", "allow-x00": True},
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": True},
            "fuzzing": {"enabled": True},
            "stateful": {"enabled": True},
        },
        "checks": {
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            "response_headers_conformance": {"enabled": True},
            "negative_data_rejection": {"enabled": True},
            "missing_required_header": {"enabled": True},
            "unsupported_method": {"enabled": True},
            "allow_header_conformance": {"enabled": True},
            "use_after_free": {"enabled": True},
            "ensure_resource_availability": {"enabled": True},
            # Inapplicable here; see the module's docstring for why.
            "positive_data_acceptance": {"enabled": False},
            "ignored_auth": {"enabled": False},
            "object_level_authorization": {"enabled": False},
        },
        "operations": [
            {
                # A job submitted without a bundle has no code to serve (404), and schemathesis infers a link to
                # it from every created job, then takes the 404 for a created resource gone missing.
                "include-operation-id": "get_code",
                "checks": {"ensure_resource_availability": {"enabled": False}},
            },
            {
                # POST /datasets makes a draft, not a dataset: until it is committed its name answers 404 on the
                # dataset routes, and schemathesis infers links from the draft's name to them all the same (a
                # flake found by CI: DELETE /datasets/{name} right after the draft was created).
                "include-operation-id": "remove_dataset",
                "checks": {"ensure_resource_availability": {"enabled": False}},
            },
            {
                "include-operation-id": "dataset_versions",
                "checks": {"ensure_resource_availability": {"enabled": False}},
            },
        ],
    }
)
# One test per operation (tests/integration/conftest.py gives each its own node id under pytest 9).
schema = schemathesis.openapi.from_dict(RAW_SCHEMA, config=CONFIG)

# Generated cases per operation in the fuzzing phase (the coverage phase adds its own boundary cases), and the
# stateful runs: sized so that the whole module takes a few minutes on two CPUs. The routes grew to ~90 operations,
# and 120 cases each made this module alone ~6 minutes of a worker's time in a 20-minute suite: 60 cases and 45 s
# of stateful runs keep every operation's coverage phase whole and halve the random part.
FUZZ_EXAMPLES = 60
STATEFUL_RUNS = 300
STATEFUL_STEPS = 15
STATEFUL_SECONDS = 45
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


@schemathesis.serializer("application/gzip", "application/x-ndjson", "text/plain")
def _raw_body(_ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    """Bodies the routes read as bytes (a bundle, metric spool or log lines): sent as generated."""
    if isinstance(value, bytes):
        return value
    data = getattr(value, "data", None)  # schemathesis' Binary, for format: binary
    if isinstance(data, bytes):
        return data
    return (value if isinstance(value, str) else json.dumps(value)).encode("utf-8", "replace")


class KilnSigner(requests.auth.AuthBase):
    """Signs every request exactly as sent (KILN-HMAC-SHA256, docs/signing.md) with kiln.auth.signing, the
    definition the SDK and the server share: the raw path, the canonical form of the raw query, the SHA-256 of
    the body's bytes (UNSIGNED-PAYLOAD on the streamed upload routes, as the SDK sends bundles)."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self.access_key = access_key
        self.secret_key = secret_key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        url = urlsplit(request.url or "")
        body = request.body
        if isinstance(body, str):  # sent as bytes, so that what is hashed is what goes on the wire
            body = body.encode("utf-8")
            request.body = body
            request.prepare_content_length(body)
        data = b"" if body is None else bytes(body)  # type: ignore[arg-type]
        method = (request.method or "GET").upper()
        streamed = method == "PUT" and STREAMED_UPLOAD.fullmatch(unquote(url.path)) is not None
        for name in ("Authorization", signing.HEADER_DATE, signing.HEADER_NONCE, signing.HEADER_CONTENT):
            request.headers.pop(name, None)
        request.headers.update(
            signing.sign_headers(
                access_key=self.access_key,
                secret_key=self.secret_key,
                method=method,
                path=url.path,
                query=signing.canonical_query_from_raw(url.query),
                content_sha256=signing.UNSIGNED_PAYLOAD if streamed else signing.body_sha256(data),
            )
        )
        return request


@dataclass
class Guard:
    """Who the fuzzer is, and the decoys its requests are sent to where they would otherwise lock the test out
    (disable its own key or user, set its own organisation's quota to nothing) or start work (cancel the
    blocker, build a large runtime)."""

    key_id: str
    user: set[str]
    org: set[str]
    blocker: str
    decoy_key: str
    decoy_user: str
    decoy_org: str

    def apply(self, case: schemathesis.Case) -> None:
        params = case.path_parameters
        label = case.operation.label
        if params:
            if label.startswith(("POST /api/v1/keys/", "DELETE /api/v1/keys/")) and params.get("key") == self.key_id:
                params["key"] = self.decoy_key
            if label.endswith("/users/{user}/disable") and params.get("user") in self.user:
                params["user"] = self.decoy_user
            if label in ("PATCH /api/v1/orgs/{org}", "PUT /api/v1/orgs/{org}/quota") and params.get("org") in self.org:
                params["org"] = self.decoy_org
            if label.endswith("/cancel") and params.get("job_id") == self.blocker:
                params["job_id"] = "job-00000000000000000"
            if label == "GET /api/v1/jobs/{job_id}/logs" and params.get("job_id") == self.blocker and case.query:
                case.query.pop("follow", None)  # it would stream for as long as the blocker runs
            if label.endswith("/runtimes/{framework}/install") and params.get("framework") in HEAVY_FRAMEWORKS:
                params["framework"] = "python"  # a bare virtualenv, not gigabytes of wheels
        if label == "POST /api/v1/jobs":
            self._lift_tiny_cpus(case.body)

    @staticmethod
    def _lift_tiny_cpus(body: Any) -> None:
        """A job asking for (almost) no CPU would fit beside the blocker and run its generated command."""
        spec = body.get("spec") if isinstance(body, dict) else None
        resources = spec.get("resources") if isinstance(spec, dict) else None
        if isinstance(resources, dict):
            cpus = resources.get("cpus")
            if isinstance(cpus, int | float) and not isinstance(cpus, bool) and 0 < cpus < 0.5:
                resources["cpus"] = 0.5


@dataclass
class Target:
    url: str
    session: requests.Session
    guard: Guard
    server: KilnServer


def _reap(server: KilnServer, blocker: str, stop: threading.Event) -> None:
    """Cancel what the fuzzer submits (it never starts): following a job's log ends when the job does."""
    client = server.client()
    while not stop.wait(0.5):
        try:
            queued = client.request("GET", "/jobs", params={"state": ["QUEUED"], "limit": 500}).json()["items"]
            for job in queued:
                if job["id"] != blocker:
                    client.request("POST", f"/jobs/{job['id']}/cancel")
        except (KilnError, httpx.HTTPError, ValueError, KeyError):
            continue  # the next round tries again
    client.close()


@pytest.fixture(scope="module")
def api_schema(target: Target) -> schemathesis.BaseSchema:
    """The schema the server serves, as schemathesis loads it."""
    return schemathesis.openapi.from_url(target.url + "/api/v1/openapi.json", config=CONFIG)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    home = tmp_path_factory.mktemp("schema") / "home"
    server = KilnServer(
        home,
        rate_limit_per_second="0",
        cpus="1",
        gpus="",
        preemption="false",
        reconcile_interval="0.5",
    ).start()
    stop = threading.Event()
    reaper: threading.Thread | None = None
    try:
        client = server.client()
        me = client.whoami()
        blocker = client.submit(
            {
                "name": "blocker",
                "command": [sys.executable, "-c", "import time; time.sleep(3600)"],
                "runtime": {"python": sys.executable},
                "resources": {"cpus": 1},
                "priority": "high",
            }
        )
        decoy_org = client.create_org("decoy")
        decoy_user = client.create_user("decoy-user", org=decoy_org.id, role="admin")
        decoy_key = client.create_key(user=decoy_user.id)
        client.close()
        creds = server.credentials()
        session = requests.Session()
        session.auth = KilnSigner(creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
        guard = Guard(
            key_id=creds["KILN_ACCESS_KEY"],
            user={me.user_id, me.user_name},
            org={me.org_id, me.org_name},
            blocker=blocker.id,
            decoy_key=decoy_key.id,
            decoy_user=decoy_user.id,
            decoy_org=decoy_org.id,
        )
        reaper = threading.Thread(target=_reap, args=(server, blocker.id, stop), daemon=True)
        reaper.start()
        yield Target(server.url, session, guard, server)
        assert server.proc is not None and server.proc.poll() is None, f"the server died:\n{server.log()}"
    finally:
        stop.set()
        if reaper is not None:
            reaper.join(10)
        server.stop()


def _call(target: Target, case: schemathesis.Case) -> None:
    target.guard.apply(case)
    case.call_and_validate(base_url=target.url, session=target.session, timeout=30)


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_conforms(case: schemathesis.Case, target: Target) -> None:
    _call(target, case)


def test_every_operation_has_a_test_of_its_own(request: pytest.FixtureRequest) -> None:
    """Each operation's test has its own node id: pytest-xdist schedules by node id, and with one id for all of
    them (what schemathesis 4.32 gives under pytest 9) it ran one operation's test instead of all of them."""
    module = request.node.parent
    assert isinstance(module, pytest.Module)
    (collector,) = [c for c in module.collect() if c.name == "test_every_operation_conforms"]
    assert isinstance(collector, pytest.Collector)
    items = [item for item in collector.collect() if isinstance(item, pytest.Item)]
    pytest_collection_modifyitems(items)  # what the collection of the whole session does
    ids = [item.nodeid for item in items]
    operations = sum(len(item) for item in RAW_SCHEMA["paths"].values())
    assert len(ids) == len(set(ids)) == operations, ids[:3]
    assert "tests/integration/api/test_api_schema.py::test_every_operation_conforms[GET /api/v1/jobs]" in ids


def test_the_served_schema_is_the_one_tested(target: Target) -> None:
    served = httpx.get(target.url + "/api/v1/openapi.json", timeout=10).json()
    assert json.dumps(served, sort_keys=True) == json.dumps(RAW_SCHEMA, sort_keys=True)


def test_linked_operations_conform(target: Target, api_schema: schemathesis.BaseSchema) -> None:
    """Sequences of calls along the links between operations (and the links schemathesis infers)."""
    found: list[str] = []
    completed = 0

    class Workflow(api_schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: schemathesis.Case) -> None:
            target.guard.apply(case)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"base_url": target.url, "session": target.session, "timeout": 30}

        def step(self, input: StepInput) -> StepOutput:
            try:
                return super().step(input)
            except Exception as exc:
                found.append(f"{input.case.operation.label}: {type(exc).__name__}: {exc}")
                raise

        def teardown(self) -> None:
            nonlocal completed
            completed += 1
            super().teardown()

    assert issubclass(Workflow, APIStateMachine)
    # Which steps are possible depends on the server's state, which every scenario changes: a scenario cannot be
    # replayed (from the example database, to shrink it, or to report it) and Hypothesis, seeing the same choices
    # lead elsewhere, stops with Flaky. As schemathesis' own runner does, that is not a failure: the scenarios go
    # on where they stopped, and a failure is reported as it was first seen.
    deadline = time.monotonic() + STATEFUL_SECONDS
    while completed < STATEFUL_RUNS and time.monotonic() < deadline:
        try:
            Workflow.run(
                settings=settings(
                    max_examples=STATEFUL_RUNS - completed,
                    stateful_step_count=STATEFUL_STEPS,
                    deadline=None,
                    database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
            )
            break
        except Exception as exc:
            if found:
                raise AssertionError(f"{len(found)} failing step(s); the first:\n{found[0]}") from exc
            if not isinstance(exc, Flaky):
                raise
    assert completed > 0


def test_a_405_names_every_method_of_the_path(target: Target) -> None:
    response = target.session.delete(target.url + "/api/v1/jobs", timeout=10)
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"
    assert sorted(m.strip() for m in response.headers["Allow"].split(",")) == ["GET", "POST"]
    response = target.session.options(target.url + "/api/v1/blobs/" + "0" * 64, timeout=10)
    assert response.status_code == 405
    assert sorted(m.strip() for m in response.headers["Allow"].split(",")) == ["HEAD", "PUT"]
