"""Refused authentications and mutating requests land in the audit trail, with whose key it was; the trail is
scoped to the reader's organisation."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from kiln.auth import signing
from kiln.auth.secrets import new_access_key_id
from tests.tenancy_helpers import Api, Tenant, close_all, create_key, create_tenant, job_spec

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@dataclass
class World:
    url: str
    admin: Api
    a: Tenant
    b: Tenant


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from tests.kilnserver import KilnServer

    server = KilnServer(tmp_path_factory.mktemp("audit") / "home", cpus="8").start()
    admin = Api.admin(server)
    a = create_tenant(admin, "audit-alpha", ("admin", "member", "viewer"))
    b = create_tenant(admin, "audit-bravo", ("admin", "member"))
    try:
        yield World(server.url, admin, a, b)
    finally:
        close_all(a, b)
        admin.close()
        server.stop()


def unauthenticated_records(world: World, key_id: str) -> list[dict[str, Any]]:
    records = world.admin.audit_until(lambda rs: any(r["key_id"] == key_id for r in rs), outcome="unauthenticated")
    return [r for r in records if r["key_id"] == key_id]


def assert_401(response: Any, reason: str) -> None:
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "unauthenticated"
    assert response.json()["details"]["reason"] == reason


def assert_recorded(world: World, key_id: str, method: str, path: str, reason: str, user: Any) -> dict[str, Any]:
    """Exactly one unauthenticated record for this key, naming the key's user and organisation."""
    records = unauthenticated_records(world, key_id)
    assert len(records) == 1, records
    record = records[0]
    assert record["action"] == f"{method} {path}", record
    assert record["resource"] == path, record
    assert (record["outcome"], record["status"], record["detail"]) == ("unauthenticated", 401, reason), record
    assert record["client"] == "127.0.0.1", record
    if user is None:
        assert (record["org_id"], record["user_id"]) == (None, None), record
    else:
        assert (record["org_id"], record["user_id"]) == (world.a.id, user.user_id), record
    return record


def fresh_key(world: World, role: str = "member", **body: Any) -> tuple[str, str, Api]:
    account = world.a[role]
    return create_key(world.admin, world.url, account.user_name, f"{role}-extra", **body)


# -- refused authentications -------------------------------------------------------------------------------------


def test_tampered_body_is_401_and_audited(world: World) -> None:
    key_id, _, api = fresh_key(world)
    signed = json.dumps({"spec": job_spec("echo signed")}).encode()
    sent = json.dumps({"spec": job_spec("echo tampered-audit-body")}).encode()
    headers = {**api.headers("POST", "/api/v1/jobs", body=signed), "Content-Type": "application/json"}
    response = api.http.request("POST", "/api/v1/jobs", headers=headers, content=sent)
    assert_401(response, "body_hash")
    assert_recorded(world, key_id, "POST", "/api/v1/jobs", "body_hash", world.a["member"])
    commands = [j["spec"]["command"] for j in world.admin.ok("GET", "/jobs", params={"limit": 500})["items"]]
    assert "echo tampered-audit-body" not in commands and "echo signed" not in commands
    api.close()


def test_replayed_request_is_401_and_audited(world: World) -> None:
    key_id, _, api = fresh_key(world)
    request = api.build("GET", "/whoami")
    assert api.http.send(request).status_code == 200
    replay = api.http.build_request("GET", "/api/v1/whoami", headers=dict(request.headers))
    assert_401(api.http.send(replay), "replayed")
    assert_recorded(world, key_id, "GET", "/api/v1/whoami", "replayed", world.a["member"])
    api.close()


def test_stale_request_is_401_and_audited(world: World) -> None:
    key_id, _, api = fresh_key(world, "viewer")
    assert_401(api.get("/orgs", date=int(time.time()) - 1000), "stale")
    assert_recorded(world, key_id, "GET", "/api/v1/orgs", "stale", world.a["viewer"])
    api.close()


def test_disabled_key_is_401_and_audited(world: World) -> None:
    key_id, _, api = fresh_key(world)
    assert api.get("/whoami").status_code == 200
    world.a["admin"].api.ok("POST", f"/keys/{key_id}/disable")
    response = api.post("/jobs", {"spec": job_spec("echo from a disabled key")})
    assert_401(response, "key_disabled")
    assert response.json()["message"] == f"access key {key_id} is disabled"
    assert_recorded(world, key_id, "POST", "/api/v1/jobs", "key_disabled", world.a["member"])
    api.close()


def test_disabled_user_is_401_and_audited_and_enabled_again(world: World) -> None:
    admin = world.a["admin"].api
    key_id, _, api = fresh_key(world, "viewer")
    admin.ok("POST", f"/users/{world.a['viewer'].user_name}/disable")
    try:
        response = api.get("/jobs")
        assert_401(response, "key_disabled")
        assert response.json()["message"] == f"the user of access key {key_id} is disabled"
        assert_recorded(world, key_id, "GET", "/api/v1/jobs", "key_disabled", world.a["viewer"])
    finally:
        admin.ok("POST", f"/users/{world.a['viewer'].user_name}/enable")
    assert api.get("/jobs").status_code == 200
    api.close()


def test_expired_key_is_401_and_audited(world: World) -> None:
    created = world.a["member"].api.ok("POST", "/keys", json_body={"expires_in": 1, "description": "short"})
    assert created["expires_at"], created
    api = Api(world.url, created["id"], created["secret_key"])
    assert api.get("/whoami").status_code == 200
    time.sleep(1.3)
    response = api.get("/whoami")
    assert_401(response, "key_expired")
    assert response.json()["message"].startswith(f"access key {created['id']} expired at 20")
    assert_recorded(world, created["id"], "GET", "/api/v1/whoami", "key_expired", world.a["member"])
    api.close()


def test_unknown_key_is_401_and_audited_without_an_organisation(world: World) -> None:
    key_id = new_access_key_id()
    api = Api(world.url, key_id, "no-such-secret")
    assert_401(api.post("/jobs", {"spec": job_spec("echo who")}), "unknown_key")
    assert_recorded(world, key_id, "POST", "/api/v1/jobs", "unknown_key", None)
    api.close()


def test_tampered_artifact_upload_is_refused_and_not_stored(world: World) -> None:
    member = world.a["member"].api
    job = member.submit(SLEEPER)
    try:
        member.wait(job["id"], "RUNNING")
        path = f"/api/v1/jobs/{job['id']}/artifacts/signed.txt"
        headers = member.headers("PUT", path, body=b"what was signed")
        response = member.http.request("PUT", path, headers=headers, content=b"something else")
        assert response.status_code in (400, 401), response.text
        assert member.get(f"/jobs/{job['id']}/artifacts/signed.txt").status_code == 404
        assert member.ok("GET", f"/jobs/{job['id']}/artifacts")["items"] == []
    finally:
        member.ok("POST", f"/jobs/{job['id']}/cancel")


# -- successful, denied and failed mutating requests ---------------------------------------------------------------


def test_a_mutating_request_is_audited_with_who_what_and_outcome(world: World) -> None:
    member = world.a["member"]
    started = datetime.now(UTC)
    job = member.api.submit(SLEEPER)  # still running when it is cancelled below

    def mine(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rs if job["id"] in r["resource"]]

    records = mine(world.admin.audit_until(mine, action="submit_job", user=member.user_name))
    assert len(records) == 1, records
    record = records[0]
    assert record["resource"] == f"id={job['id']}", record
    assert (record["action"], record["outcome"], record["status"]) == ("submit_job", "success", 201), record
    assert (record["org_id"], record["user_id"], record["key_id"]) == (world.a.id, member.user_id, member.key_id)
    assert record["client"] == "127.0.0.1"
    assert datetime.fromisoformat(record["time"]) >= started.replace(microsecond=0)
    # Cancelling names the job in the resource.
    member.api.ok("POST", f"/jobs/{job['id']}/cancel")
    cancelled = f"job_id={job['id']}"
    cancels = world.admin.audit_until(lambda rs: any(r["resource"] == cancelled for r in rs), action="cancel_job")
    assert [r["user_id"] for r in cancels if r["resource"] == cancelled] == [member.user_id], cancels


def test_denied_and_failed_requests_are_audited(world: World) -> None:
    viewer, member = world.a["viewer"], world.a["member"]
    assert viewer.api.post("/jobs", {"spec": job_spec("echo viewer")}).status_code == 403
    denied = world.admin.audit_until(bool, user=viewer.user_id, action="submit_job", outcome="denied")
    assert denied and denied[0]["status"] == 403 and denied[0]["key_id"] == viewer.key_id, denied
    assert member.api.post("/jobs", {"spec": {"command": "echo", "bogus": 1}}).status_code == 422
    failed = world.admin.audit_until(bool, user=member.user_name, action="submit_job", outcome="failed")
    assert failed and failed[0]["status"] == 422 and failed[0]["org_id"] == world.a.id, failed


# -- who may read the trail ---------------------------------------------------------------------------------------


def test_an_org_admin_sees_only_their_organisation(world: World) -> None:
    a_job = world.a["member"].api.submit("echo alpha")
    b_job = world.b["member"].api.submit("echo bravo")
    Api(world.url, new_access_key_id(), "x").post("/jobs", {"spec": job_spec("echo nobody")})  # org-less record
    everything = world.admin.audit_until(
        lambda rs: (
            any(b_job["id"] in r["resource"] for r in rs)
            and any(a_job["id"] in r["resource"] for r in rs)
            and any(r["org_id"] is None for r in rs)
        )
    )
    assert any(b_job["id"] in r["resource"] for r in everything)
    assert any(r["org_id"] is None for r in everything)

    seen = world.a["admin"].api.audit()
    assert seen and all(r["org_id"] == world.a.id for r in seen), {r["org_id"] for r in seen}
    assert any(a_job["id"] in r["resource"] for r in seen)
    assert not any(b_job["id"] in r["resource"] for r in seen)
    assert world.a["admin"].api.audit(org=world.a.name) == world.a["admin"].api.audit()
    assert world.a["admin"].api.get("/audit", params={"org": world.b.name}).status_code == 404
    assert world.a["admin"].api.get("/audit", params={"org": world.b.id}).status_code == 404
    # Filtering by another organisation's user finds nothing.
    assert world.a["admin"].api.audit(user=world.b["member"].user_name) == []
    b_seen = world.b["admin"].api.audit()
    assert b_seen and all(r["org_id"] == world.b.id for r in b_seen)


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_may_not_read_the_trail(world: World, role: str) -> None:
    response = world.a[role].api.get("/audit")
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "forbidden"


def test_audit_filters(world: World) -> None:
    member = world.a["member"]
    first = member.api.submit("echo for filters")
    world.admin.audit_until(lambda rs: any(first["id"] in r["resource"] for r in rs), user=member.user_id)
    time.sleep(0.05)
    middle = datetime.now(UTC)
    second = member.api.submit("echo after the middle")
    all_member = world.admin.audit_until(lambda rs: any(second["id"] in r["resource"] for r in rs), user=member.user_id)
    assert all_member and all(r["user_id"] == member.user_id for r in all_member)
    assert world.admin.audit(user=member.user_name) == all_member
    later = world.admin.audit(user=member.user_id, since=middle.isoformat())
    earlier = world.admin.audit(user=member.user_id, until=middle.isoformat())
    assert later and all(datetime.fromisoformat(r["time"]) >= middle for r in later)
    assert earlier and all(datetime.fromisoformat(r["time"]) <= middle for r in earlier)
    assert {r["id"] for r in later} | {r["id"] for r in earlier} == {r["id"] for r in all_member}
    # A record of each outcome of its own: run alone (-k test_audit_filters) there was no refused request to find,
    # only the module's other tests had made one.
    nobody = Api(world.url, new_access_key_id(), "x")
    assert nobody.get("/whoami").status_code == 401
    nobody.close()
    assert world.a["viewer"].api.post("/jobs", {"spec": job_spec("echo denied for filters")}).status_code == 403
    for outcome in ("unauthenticated", "denied", "success"):
        rows = world.admin.audit_until(bool, outcome=outcome)
        assert rows and all(r["outcome"] == outcome for r in rows), outcome
    assert len(world.admin.audit(limit=2)) == 2
    assert all("submit" in r["action"] for r in world.admin.audit(action="submit"))


def test_signature_helpers_sign_what_they_send(world: World) -> None:
    # Guard for the tests above: an untouched request built the same way is accepted.
    api = world.a["member"].api
    request = api.build("POST", "/jobs", json_body={"spec": job_spec("echo untouched")})
    assert request.headers[signing.HEADER_CONTENT] == signing.body_sha256(request.content)
    assert api.http.send(request).status_code == 201
