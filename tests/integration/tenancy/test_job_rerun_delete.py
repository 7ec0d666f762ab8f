"""The job verbs that check before they act, on one real server: a dry run of a submit (every check, nothing
created), a rerun (same spec and code, a new job) and a delete (the job and everything it stored), each with the
tenancy rules: another organisation's job is 404, a viewer is 403, and every change is audited."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy

from kiln.sdk.client import Client
from tests.components import require
from tests.conftest import _pg_connect, postgres_available
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant, job_spec, tar_gz

PY = sys.executable
WRITES = (
    "import os; open(os.path.join(os.environ['KILN_OUTPUT_DIR'], 'model.bin'), 'wb').write(b'w' * 1_000_000); "
    "print('step=1 loss=0.5'); print('step=2 loss=0.25'); print(open('code.txt').read())"
)
SLEEPER = [PY, "-c", "import time; time.sleep(120)"]


@dataclass
class World:
    server: KilnServer
    database_url: str
    admin: Api
    acme: Tenant
    beta: Tenant


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One server per database for the module (deleting cascades differently on each)."""
    home = tmp_path_factory.mktemp("verbs") / "home"
    pg_name = ""
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'kiln.db'}"
    else:
        require("postgresql", postgres_available())
        pg_name = f"kiln_test_{secrets.token_hex(6)}"
        with _pg_connect() as conn:
            conn.execute(f'CREATE DATABASE "{pg_name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}"
    server = KilnServer(home, url if pg_name else None, cpus="2").start()
    admin = Api.admin(server)
    acme = create_tenant(admin, "verbs-acme")
    beta = create_tenant(admin, "verbs-beta", ("admin", "member"))
    try:
        yield World(server, url, admin, acme, beta)
    finally:
        close_all(acme, beta)
        admin.close()
        server.stop()
        if pg_name:
            with _pg_connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


def upload_code(api: Api, text: bytes) -> str:
    data, sha = tar_gz({"code.txt": text})
    response = api.request("PUT", f"/blobs/{sha}", content=data, content_type="application/gzip", unsigned=True)
    assert response.status_code in (200, 201), response.text
    return sha


def storage_used(api: Api) -> int:
    report = api.ok("GET", "/quota")
    return int(next(c for c in report["categories"] if c["category"] == "total")["used"]["storage"])


def rows(database_url: str, table: str, job_id: str) -> int:
    """The job's rows in ``table``, read from the server's database directly."""
    column = "id" if table == "jobs" else "job_id"
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.connect() as conn:
            query = sqlalchemy.text(f"SELECT count(*) FROM {table} WHERE {column} = :job_id")
            return int(conn.execute(query, {"job_id": job_id}).scalar_one())
    finally:
        engine.dispose()


def audited(admin: Api, action: str, job_id: str) -> list[dict[str, Any]]:
    return admin.audit_until(lambda records: any(job_id in r["resource"] for r in records), action=action, org=None)


def test_a_dry_run_checks_everything_and_creates_nothing(world: World) -> None:
    server, admin, acme = world.server, world.admin, world.acme
    member = acme["member"].api
    creds = acme["member"]
    client = Client(server.url, creds.key_id, creds.secret)
    data = server.home.parent / "dry-data"
    data.mkdir()
    (data / "x.csv").write_text("1,2\n")
    client.put_dataset(data, "dry-digits", state_dir=server.home.parent / "uploads")
    client.close()
    sha = upload_code(member, b"dry run\n")
    jobs_before = member.ok("GET", "/jobs")["items"]

    spec = job_spec("true", name="dry", inputs=[{"dataset": "dry-digits"}], resources={"cpus": 0.5})
    answer = member.ok("POST", "/jobs:dry-run", json_body={"spec": spec, "code_sha256": sha})
    assert answer["spec"]["inputs"][0]["dataset"] == "dry-digits@1"  # pinned, as the job would get it
    assert (answer["name"], answer["code_sha256"], answer["code_stored"]) == ("dry", sha, True)
    missing = "0" * 64
    assert member.ok("POST", "/jobs:dry-run", json_body={"spec": spec, "code_sha256": missing})["code_stored"] is False
    assert member.ok("POST", "/jobs:dry-run", json_body={"spec": job_spec("true")})["code_stored"] is None

    refusals = [
        ({"resources": {"cpus": 1000}}, 422, "resources: the job"),
        ({"inputs": [{"dataset": "no-such-data"}]}, 422, "inputs[0].dataset: no dataset 'no-such-data'"),
        ({"runtime": {"framework": "no-such-framework"}}, 422, "unknown framework 'no-such-framework'"),
        ({"priority": "high"}, 403, "priority: high is above"),
    ]
    for extra, status, message in refusals:
        response = member.post("/jobs:dry-run", {"spec": {**job_spec("true"), **extra}})
        assert response.status_code == status, response.text
        assert message in response.json()["message"]
    # The same refusal as a submit's: a quota the job can never fit.
    admin.ok("PUT", f"/orgs/{acme.id}/quota", json_body={"category": "train", "cpus": 1})
    try:
        response = member.post("/jobs:dry-run", {"spec": job_spec("true", resources={"cpus": 1.5})})
        assert response.status_code == 403 and response.json()["message"].startswith("quota: the job asks cpus 1.5")
    finally:
        admin.ok("PUT", f"/orgs/{acme.id}/quota", json_body={"category": "train", "cpus": None})
    viewer = acme["viewer"].api.post("/jobs:dry-run", {"spec": job_spec("true")})
    assert viewer.status_code == 403, viewer.text

    assert member.ok("GET", "/jobs")["items"] == jobs_before  # no job, so no event either
    records = admin.audit(org=acme.id)
    assert not [r for r in records if r["action"] == "submit_job"]
    assert [r for r in records if r["action"] == "dry_run_job"]


def test_rerun_submits_the_same_spec_and_code_as_a_new_job(world: World) -> None:
    admin, acme, beta = world.admin, world.acme, world.beta
    member = acme["member"].api
    sha = upload_code(member, b"rerun code\n")
    first = member.ok(
        "POST", "/jobs", json_body={"spec": job_spec([PY, "-c", WRITES], name="orig"), "code_sha256": sha}
    )
    assert member.wait(first["id"])["state"] == "SUCCEEDED"

    again = member.ok("POST", f"/jobs/{first['id']}/rerun", json_body={"name": "second"})
    assert again["id"] != first["id"] and again["code_sha256"] == sha and again["name"] == "second"
    assert {**again["spec"], "name": "orig"} == first["spec"]
    assert member.wait(again["id"])["state"] == "SUCCEEDED"
    assert b"rerun code" in member.get(f"/jobs/{again['id']}/logs").content
    events = member.events(again["id"])
    assert events[0]["message"] == f"rerun of {first['id']} by verbs-acme-member"
    plain = member.ok("POST", f"/jobs/{first['id']}/rerun")  # no body: the job's own name
    assert plain["name"] == "orig"
    assert audited(admin, "rerun_job", first["id"])

    # A running job can be rerun too; the rerun waits for nothing of it.
    running = member.submit(SLEEPER, name="sleeper")
    member.wait(running["id"], "RUNNING")
    copy = member.ok("POST", f"/jobs/{running['id']}/rerun")
    assert copy["state"] in ("QUEUED", "STARTING", "RUNNING") and copy["spec"] == running["spec"]

    # Tenancy: another organisation gets the answer of a job that does not exist, a viewer may not.
    for api in (beta["member"].api, beta["admin"].api):
        response = api.post(f"/jobs/{first['id']}/rerun")
        assert response.status_code == 404, response.text
        nothing = api.post("/jobs/job-00000000000000000000/rerun").json()
        assert response.json() == {**nothing, "message": f"job {first['id']} not found"}
    assert acme["viewer"].api.post(f"/jobs/{first['id']}/rerun").status_code == 403
    assert admin.post(f"/jobs/{first['id']}/rerun").status_code == 409  # the platform admin's org lacks the code
    for job in (running, copy, plain):
        member.post(f"/jobs/{job['id']}/cancel")


def test_delete_removes_an_ended_job_and_frees_its_storage(world: World) -> None:
    server, admin, acme, beta = world.server, world.admin, world.acme, world.beta
    member = acme["member"].api
    sha = upload_code(member, b"delete code\n")
    job = member.ok("POST", "/jobs", json_body={"spec": job_spec([PY, "-c", WRITES]), "code_sha256": sha})
    assert member.wait(job["id"])["state"] == "SUCCEEDED"
    job_id = job["id"]
    deadline = time.monotonic() + 30
    while not member.ok("GET", f"/jobs/{job_id}/metrics/summary")["series"]:
        assert time.monotonic() < deadline, "the log's metrics were never ingested"
        time.sleep(0.2)
    assert member.ok("GET", f"/jobs/{job_id}/artifacts")["items"] == [{"path": "model.bin", "size": 1_000_000}]
    log_file = server.home / "logs" / f"{job_id}.log"
    outputs = list((server.home / "store").glob(f"orgs/*/jobs/{job_id}"))
    assert log_file.is_file() and outputs and rows(world.database_url, "metric_series", job_id)

    # Not while it runs; not another organisation's; not a viewer's to delete.
    running = member.submit(SLEEPER)
    member.wait(running["id"], "RUNNING")
    refused = member.request("DELETE", f"/jobs/{running['id']}")
    assert refused.status_code == 409 and "cancel it first" in refused.json()["message"], refused.text
    for api in (beta["member"].api, beta["admin"].api):
        response = api.request("DELETE", f"/jobs/{job_id}")
        assert response.status_code == 404, response.text
        nothing = api.request("DELETE", "/jobs/job-00000000000000000000").json()
        assert response.json() == {**nothing, "message": f"job {job_id} not found"}
    assert acme["viewer"].api.request("DELETE", f"/jobs/{job_id}").status_code == 403
    member.post(f"/jobs/{running['id']}/cancel")
    member.wait(running["id"])  # ended: its log (counted in the storage too) is done growing
    used, log_size = storage_used(member), log_file.stat().st_size

    deleted = member.request("DELETE", f"/jobs/{job_id}")
    assert deleted.status_code == 204, deleted.text
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events", f"/jobs/{job_id}/artifacts"):
        assert member.get(path).status_code == 404, path
    assert member.request("DELETE", f"/jobs/{job_id}").status_code == 404
    assert job_id not in {j["id"] for j in member.ok("GET", "/jobs")["items"]}
    # Its outputs and its log go; the code bundle stays (other jobs may share it).
    assert used - 1_000_000 - log_size <= storage_used(member) < used - 1_000_000
    assert not log_file.exists() and not any(p.exists() for p in outputs)
    for table in ("jobs", "job_events", "metric_series", "metric_cursors"):
        assert rows(world.database_url, table, job_id) == 0, table
    assert audited(admin, "delete_job", job_id)
