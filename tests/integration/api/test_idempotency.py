"""Idempotent creates against real servers, on SQLite and PostgreSQL: a create repeated with its Idempotency-Key
answers 201 with the resource the first one made and ``Idempotent-Replayed: true`` (jobs, reruns, studies, model
versions, services), and exactly one exists; the key with another request is a 422 naming it; keys are per user;
concurrent requests with one key make one job; a bad key is a 422 naming the header; a refused create keeps nothing.
And the SDK: its submit, retried with one key across a server killed and started again, and after a reply lost
once the server had committed, makes one job."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from kiln.api.app import create_app
from kiln.domain.idempotency import HEADER, REPLAYED_HEADER
from kiln.sdk.client import Client
from kiln.sdk.config import read_config_file
from kiln.sdk.retries import RetryPolicy
from kiln.settings import Settings
from tests.components import require
from tests.conftest import _pg_connect, postgres_available
from tests.kilnserver import TEST_PYTHON_ROOTS, KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant, job_spec

PY = sys.executable
WRITES_MODEL = "import os; open(os.path.join(os.environ['KILN_OUTPUT_DIR'], 'model.pkl'), 'wb').write(b'weights')"


@dataclass
class World:
    server: KilnServer
    admin: Api
    acme: Tenant
    beta: Tenant


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One server per database for the module, with two organisations."""
    home = tmp_path_factory.mktemp("idempotency") / "home"
    pg_name = ""
    if request.param == "postgresql":
        require("postgresql", postgres_available())
        pg_name = f"kiln_test_{uuid.uuid4().hex[:12]}"
        with _pg_connect() as conn:
            conn.execute(f'CREATE DATABASE "{pg_name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}" if pg_name else None
    server = KilnServer(home, url, cpus="2").start()
    admin = Api.admin(server)
    acme = create_tenant(admin, "idem-acme", ("admin", "member"))
    beta = create_tenant(admin, "idem-beta", ("member",))
    try:
        yield World(server, admin, acme, beta)
    finally:
        close_all(acme, beta)
        admin.close()
        server.stop()
        if pg_name:
            with _pg_connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def post(api: Api, path: str, body: Any, key: str | None, http: httpx.Client | None = None) -> httpx.Response:
    """A signed POST with ``key`` as its Idempotency-Key (the header is not signed: docs/idempotency.md)."""
    built = api.build("POST", path, json_body=body)
    if key is not None:
        built.headers[HEADER] = key
    return (http or api.http).send(built)


def jobs_named(api: Api, name: str) -> list[dict[str, Any]]:
    return [j for j in api.ok("GET", "/jobs", params={"limit": 500})["items"] if j["name"] == name]


def created(response: httpx.Response, replayed: bool) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    assert response.headers.get(REPLAYED_HEADER) == ("true" if replayed else None), dict(response.headers)
    return response.json()  # type: ignore[no-any-return]


def test_a_repeated_submit_answers_the_first_job_and_creates_no_other(world: World) -> None:
    member = world.acme["member"].api
    name = unique("repeat")
    body = {"spec": job_spec("true", name=name)}
    first = created(post(member, "/jobs", body, "submit-1"), replayed=False)
    second = created(post(member, "/jobs", body, "submit-1"), replayed=True)
    assert second["id"] == first["id"] and second["name"] == name
    # The same document written another way (key order) is the same request.
    reordered = {"spec": dict(reversed(list(body["spec"].items())))}
    assert created(post(member, "/jobs", reordered, "submit-1"), replayed=True)["id"] == first["id"]
    assert [j["id"] for j in jobs_named(member, name)] == [first["id"]]
    # The audit has each request, the repeats marked as such.
    admin = world.acme["admin"].api
    mine = f"id={first['id']}"
    records = admin.audit_until(lambda found: len([r for r in found if r["resource"] == mine]) == 3, action="submit")
    assert sorted(r["detail"] for r in records if r["resource"] == mine) == [
        "",
        "idempotent replay",
        "idempotent replay",
    ]
    # Without a key the same body is a second job, as before.
    created(post(member, "/jobs", body, None), replayed=False)
    assert len(jobs_named(member, name)) == 2


def test_the_key_with_another_body_or_route_is_a_422_naming_the_key(world: World) -> None:
    member = world.acme["member"].api
    name = unique("mismatch")
    created(post(member, "/jobs", {"spec": job_spec("true", name=name)}, "abc-mismatch"), replayed=False)
    other = post(member, "/jobs", {"spec": job_spec("echo other", name=name)}, "abc-mismatch")
    assert other.status_code == 422, other.text
    assert other.json()["message"] == (
        "Idempotency-Key 'abc-mismatch' was used for a different request (POST /api/v1/jobs with another body) "
        "within 24 h: use a new key"
    )
    assert other.json()["details"]["field"] == f"header.{HEADER}"
    study = post(member, "/studies", {"spec": study_spec(unique("s"))}, "abc-mismatch")
    assert study.status_code == 422 and "(POST /api/v1/jobs) within 24 h" in study.json()["message"], study.text
    assert len(jobs_named(member, name)) == 1


def test_keys_are_per_user_and_never_answer_another_users_job(world: World) -> None:
    name = unique("per-user")
    body = {"spec": job_spec("true", name=name)}
    callers = [world.acme["member"], world.acme["admin"], world.beta["member"]]
    jobs = [created(post(account.api, "/jobs", body, "shared-key"), replayed=False) for account in callers]
    assert len({job["id"] for job in jobs}) == 3
    assert [job["user_id"] for job in jobs] == [account.user_id for account in callers]
    # Each user's repeat answers their own job.
    for account, job in zip(callers, jobs, strict=True):
        assert created(post(account.api, "/jobs", body, "shared-key"), replayed=True)["id"] == job["id"]


def test_concurrent_submits_with_one_key_make_one_job(world: World) -> None:
    account = world.acme["member"]
    name = unique("concurrent")
    body = {"spec": job_spec("true", name=name)}
    barrier = threading.Barrier(6, timeout=30)
    answers: list[httpx.Response] = []

    def submit() -> None:
        with httpx.Client(base_url=world.server.url, timeout=60) as http:
            built = account.api.build("POST", "/jobs", json_body=body)
            built.headers[HEADER] = "concurrent-key"
            barrier.wait()
            answers.append(http.send(built))

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert len(answers) == 6 and all(a.status_code == 201 for a in answers), [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.headers.get(REPLAYED_HEADER) == "true" for a in answers) == 5
    assert len(jobs_named(account.api, name)) == 1


@pytest.mark.parametrize(
    ("key", "why"),
    [("k" * 256, "at most 255 characters"), ("café", "not printable ASCII"), ("", "is empty")],
    ids=["too-long", "not-ascii", "empty"],
)
def test_a_bad_key_is_a_422_naming_the_header(world: World, key: str, why: str) -> None:
    member = world.acme["member"].api
    name = unique("bad-key")
    response = post(member, "/jobs", {"spec": job_spec("true", name=name)}, key)
    assert response.status_code == 422, response.text
    assert "Idempotency-Key" in response.json()["message"] and why in response.json()["message"], response.text
    assert jobs_named(member, name) == []


def test_a_refused_create_keeps_nothing_and_its_key_serves_the_fixed_request(world: World) -> None:
    member = world.acme["member"].api
    name = unique("refused")
    too_big = post(member, "/jobs", {"spec": job_spec("true", name=name, resources={"cpus": 4096})}, "fix-me")
    assert too_big.status_code == 422, too_big.text
    fixed = created(post(member, "/jobs", {"spec": job_spec("true", name=name)}, "fix-me"), replayed=False)
    assert [j["id"] for j in jobs_named(member, name)] == [fixed["id"]]


def test_a_rerun_repeated_with_its_key_answers_the_first_new_job(world: World) -> None:
    member = world.acme["member"].api
    source = member.submit("true", name=unique("source"))
    name = unique("rerun")
    first = created(post(member, f"/jobs/{source['id']}/rerun", {"name": name}, "rerun-1"), replayed=False)
    again = created(post(member, f"/jobs/{source['id']}/rerun", {"name": name}, "rerun-1"), replayed=True)
    assert again["id"] == first["id"] != source["id"]
    assert len(jobs_named(member, name)) == 1


def study_spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "trial": {"command": "echo step=0 score={x}", "runtime": {"python": PY}, "resources": {"cpus": 0.5}},
        "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "score", "direction": "maximize"},
        "max_trials": 1,
    }


def test_a_study_repeated_with_its_key_answers_the_first_study(world: World) -> None:
    member = world.acme["member"].api
    name = unique("study")
    body = {"spec": study_spec(name)}
    first = created(post(member, "/studies", body, "study-1"), replayed=False)
    again = created(post(member, "/studies", body, "study-1"), replayed=True)
    assert again["id"] == first["id"] and again["name"] == name
    studies = member.ok("GET", "/studies", params={"limit": 200})["items"]
    assert [s["id"] for s in studies if s["name"] == name] == [first["id"]]


def test_a_model_version_and_a_service_repeated_with_their_keys_are_made_once(world: World) -> None:
    member = world.acme["member"].api
    job = member.submit([PY, "-c", WRITES_MODEL], name=unique("trainer"))
    assert member.wait(job["id"], timeout=60)["state"] == "SUCCEEDED"
    model = unique("digits")
    register = {"job_id": job["id"], "path": "model.pkl"}
    first = created(post(member, f"/models/{model}/versions", register, "register-1"), replayed=False)
    again = created(post(member, f"/models/{model}/versions", register, "register-1"), replayed=True)
    assert (first["version"], again["version"]) == (1, 1)
    assert [v["version"] for v in member.ok("GET", f"/models/{model}/versions")["items"]] == [1]

    service = {"name": unique("web"), "model": f"{model}@1", "predictor": {"type": "sklearn"}, "replicas": 0}
    service["runtime"] = {"python": PY}
    deployed = created(post(member, "/services", {"spec": service}, "deploy-1"), replayed=False)
    # Without the key a repeat is a 409 (the name is taken); with it, the service the first request made.
    assert created(post(member, "/services", {"spec": service}, "deploy-1"), replayed=True)["id"] == deployed["id"]
    assert post(member, "/services", {"spec": service}, None).status_code == 409
    member.ok("DELETE", f"/services/{service['name']}")


# -- the SDK ----------------------------------------------------------------------------------------------------


class Forwarding(httpx.BaseTransport):
    """Sends each request to the real server and records it; ``lose`` names a (method, path) whose first answer is
    read and then lost (a ReadError, as when the connection drops after the server has committed)."""

    def __init__(self, lose: tuple[str, str] | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.lose = lose
        self.requests: list[httpx.Request] = []
        self.refused = 0
        self.lost: list[dict[str, Any]] = []
        self.answers: list[httpx.Response] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        try:
            response = self.inner.handle_request(request)
        except httpx.ConnectError:
            self.refused += 1
            raise
        if (request.method, request.url.path) == self.lose and not self.lost:
            response.read()
            self.lost.append(json.loads(response.content))
            response.close()
            raise httpx.ReadError("connection reset after the server answered", request=request)
        self.answers.append(response)
        return response

    def posts(self, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == "POST" and r.url.path == path]

    def close(self) -> None:
        self.inner.close()


def test_the_sdk_retries_a_lost_reply_with_its_key_and_gets_the_same_job(world: World) -> None:
    account = world.acme["member"]
    transport = Forwarding(lose=("POST", "/api/v1/jobs"))
    with Client(world.server.url, account.key_id, account.secret, retry_seconds=30) as client:
        client._http = httpx.Client(base_url=client.endpoint, transport=transport, timeout=30)
        name = unique("lost-reply")
        job = client.submit(job_spec("true", name=name))
    posts = transport.posts("/api/v1/jobs")
    assert len(posts) == 2 and posts[0].headers[HEADER] == posts[1].headers[HEADER]
    assert transport.lost[0]["id"] == job.id  # the server had created it; the retry was answered with it
    assert transport.answers[-1].headers.get(REPLAYED_HEADER) == "true"
    assert [j["id"] for j in jobs_named(account.api, name)] == [job.id]


def test_the_sdk_retries_a_submit_across_a_server_restart_and_makes_one_job(make_server) -> None:  # type: ignore[no-untyped-def]
    server: KilnServer = make_server()
    client = server.client()
    client.retries = RetryPolicy(total=150)
    transport = Forwarding()
    client._http = httpx.Client(base_url=client.endpoint, transport=transport, timeout=30)
    # In the middle of work: the server answered this client before (an endpoint that never answered gets only
    # KILN_FIRST_CONTACT_SECONDS, a wrong address rather than a restart: tests/unit/sdk/test_retries.py).
    client.whoami()
    server.kill()  # SIGKILL: the submit meets a dead server (connection refused) until it is back
    name = unique("restart")
    outcome: dict[str, Any] = {}

    def submit() -> None:
        try:
            outcome["job"] = client.submit(job_spec("true", name=name))
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=submit)
    thread.start()
    try:
        deadline = threading.Event()
        while transport.refused < 2 and thread.is_alive():
            deadline.wait(0.05)
        server.start()  # the same home and port
        thread.join(60)  # once the server is up, the next retry (at most 5 s later) gets through
    finally:
        client.close()
    assert "error" not in outcome, outcome
    assert transport.refused >= 2
    keys = {r.headers[HEADER] for r in transport.posts("/api/v1/jobs")}
    assert len(keys) == 1
    admin = Api.admin(server)
    try:
        assert [j["id"] for j in jobs_named(admin, name)] == [outcome["job"].id]
    finally:
        admin.close()


def test_a_submits_audit_record_commits_with_its_job_not_after_the_reply(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27's chaos test (tests/integration/servers/test_chaos.py) found a job with no submit in the audit trail:
    its
    server was killed after the job committed and before the record the signature middleware writes after the
    reply, and the client's retry through another server was recorded as a replay only. A create with a key now
    writes its record in its own transaction, with the key: here the after-reply write never happens (the server
    died there), and the trail still has the submit once, then its retry as a replay."""
    home = tmp_path / "home"
    settings = Settings(home=home, database_url=database_url, allowed_python_roots=TEST_PYTHON_ROOTS)
    app = create_app(settings)
    with TestClient(app, base_url="http://testserver") as http:
        creds = read_config_file(home / "admin.env")
        client = Client("http://testserver", creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"], retry_seconds=0)
        client._http = http
        with monkeypatch.context() as died:
            died.setattr(app.state.platform.audit, "record", lambda entry: None)
            job = client.submit(job_spec("true", name="audited"), idempotency_key="audited-1")
        assert client.submit(job_spec("true", name="audited"), idempotency_key="audited-1").id == job.id
        records = [(a.resource, a.outcome, a.status, a.detail) for a in client.audit(action="submit_job")]
        assert records == [
            (f"id={job.id}", "success", 201, "idempotent replay"),
            (f"id={job.id}", "success", 201, ""),
        ]
        # Without a key nothing is written with the create: the record after the reply is the only one.
        other = client.request("POST", "/jobs", json_body={"spec": job_spec("true", name="unkeyed")}).json()
        (latest,) = client.audit(action="submit_job", limit=1)
        assert (latest.resource, latest.detail) == (f"id={other['id']}", "")
        for ended in (job.id, other["id"]):  # none left running once the server closes
            assert client.wait(ended, timeout=60).state == "SUCCEEDED"
