"""The SDK's tenancy calls and job-token authentication, against a recording httpx transport (no server)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from kiln.auth import signing
from kiln.errors import Forbidden, Unauthenticated
from kiln.sdk.client import Client
from kiln.settings import ClientSettings

NOW = "2026-03-01T12:00:00Z"
QUOTA = {"org_id": "org-1", "org_name": "acme", "categories": []}
KEY = {
    "id": "AKTEST",
    "user_id": "usr-1",
    "user_name": "bob",
    "org_id": "org-1",
    "enabled": True,
    "expires_at": None,
    "created_at": NOW,
    "last_used_at": None,
    "description": "",
}


@pytest.fixture(autouse=True)
def _no_kiln_env(monkeypatch, tmp_path):
    for name in ("KILN_ENDPOINT", "KILN_ACCESS_KEY", "KILN_SECRET_KEY", "KILN_JOB_TOKEN", "KILN_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "no-config"))


class Recorder:
    def __init__(self, reply: object = None, status: int = 200) -> None:
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []
        self.reply = reply
        self.status = status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(request.read())
        if self.reply is None:
            return httpx.Response(204 if self.status == 200 else self.status)
        return httpx.Response(self.status, json=self.reply)

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def json(self) -> object:
        return json.loads(self.bodies[-1])


def attach(client: Client, recorder: Recorder) -> Client:
    client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(recorder))
    return client


def signed(recorder: Recorder | None = None) -> tuple[Client, Recorder]:
    recorder = recorder or Recorder()
    return attach(Client("http://kiln.test", "AKADMIN", "s3cret"), recorder), recorder


def test_a_job_token_sends_a_bearer_header_and_no_signature():
    recorder = Recorder({"lines": 2})
    client = attach(Client("http://kiln.test", job_token="kjt.job-1.0.99.abc"), recorder)
    assert client.uses_job_token and client.access_key == ""
    assert client.append_logs("job-1", ["one", "two\n"]) == 2
    request = recorder.last
    assert request.headers["authorization"] == "Bearer kjt.job-1.0.99.abc"
    assert not {h.lower() for h in (signing.HEADER_DATE, signing.HEADER_NONCE, signing.HEADER_CONTENT)} & set(
        request.headers
    )
    assert request.url.path == "/api/v1/jobs/job-1/logs"
    assert request.headers["content-type"].startswith("text/plain")
    assert recorder.bodies[-1] == b"one\ntwo\n"
    assert "kjt" not in repr(client) and "job-token" in repr(client)


def test_the_token_comes_from_the_environment_when_no_key_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_ENDPOINT", "http://kiln.test")
    monkeypatch.setenv("KILN_JOB_TOKEN", "kjt.env")
    assert Client().uses_job_token

    # ... and before a `kiln login` file in the same $HOME (a job acts as itself, not as whoever logged in).
    config = tmp_path / "config"
    config.write_text("KILN_ENDPOINT=http://other\nKILN_ACCESS_KEY=AKFILE\nKILN_SECRET_KEY=file-secret\n")
    monkeypatch.setenv("KILN_CONFIG", str(config))
    from_env = Client()
    assert from_env.uses_job_token and from_env.endpoint == "http://kiln.test"

    # Keys in the environment or in the arguments win over the token.
    monkeypatch.setenv("KILN_ACCESS_KEY", "AKENV")
    monkeypatch.setenv("KILN_SECRET_KEY", "env-secret")
    assert Client().access_key == "AKENV" and not Client().uses_job_token
    monkeypatch.delenv("KILN_ACCESS_KEY")
    monkeypatch.delenv("KILN_SECRET_KEY")
    explicit = Client(access_key="AKARG", secret_key="arg-secret")
    assert explicit.access_key == "AKARG" and not explicit.uses_job_token

    monkeypatch.delenv("KILN_JOB_TOKEN")
    assert Client().access_key == "AKFILE"


def test_credentials_are_required_and_exclusive():
    with pytest.raises(Unauthenticated):
        Client("http://kiln.test")
    with pytest.raises(Unauthenticated):
        Client(job_token="kjt.x", settings=ClientSettings(config=Path("/nonexistent")))  # no endpoint
    with pytest.raises(ValueError, match="not both"):
        Client("http://kiln.test", "AK", "secret", job_token="kjt.x")


def test_set_quota_sends_only_the_given_fields_and_null_for_unlimited():
    client, recorder = signed(Recorder(QUOTA))
    report = client.set_quota("acme", gpus=4, memory="128G", count=None)
    assert report.org_name == "acme"
    assert recorder.last.method == "PUT" and recorder.last.url.path == "/api/v1/orgs/acme/quota"
    assert recorder.json() == {"category": "train", "gpus": 4, "memory": 128 * 1024**3, "count": None}
    client.set_quota("acme", "total", storage="1T")
    assert recorder.json() == {"category": "total", "storage": 1024**4}
    with pytest.raises(TypeError, match="disks"):
        client.set_quota("acme", disks=3)
    with pytest.raises(ValueError, match="category"):
        client.set_quota("acme", "gpu", gpus=1)
    client.quota()
    assert recorder.last.url.path == "/api/v1/quota"
    client.quota("org 1/x")
    assert recorder.last.url.raw_path == b"/api/v1/orgs/org%201%2Fx/quota"


def test_signed_bodies_hash_what_is_sent(tmp_path):
    client, recorder = signed(Recorder({"path": "model/w.bin", "size": 5}))
    client.upload_artifact("job-1", "/model/w.bin", b"hello")
    request = recorder.last
    assert request.method == "PUT" and request.url.path == "/api/v1/jobs/job-1/artifacts/model/w.bin"
    assert request.headers[signing.HEADER_CONTENT] == hashlib.sha256(b"hello").hexdigest()
    assert request.headers["content-type"] == "application/octet-stream"
    assert recorder.bodies[-1] == b"hello"

    data = tmp_path / "weights.bin"
    data.write_bytes(b"\x00\x01" * 700_000)
    artifact = client.upload_artifact("job-1", "weights.bin", data)
    assert artifact.size == 5  # what the server said
    assert recorder.bodies[-1] == data.read_bytes()
    assert recorder.last.headers[signing.HEADER_CONTENT] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert recorder.last.headers["content-length"] == str(data.stat().st_size)


def test_keys_users_orgs_and_audit_requests():
    client, recorder = signed(Recorder({**KEY, "secret_key": "shown-once"}))
    created = client.create_key("bob", expires_in=timedelta(days=30), description="ci")
    assert created.secret_key == "shown-once"
    assert recorder.json() == {"user": "bob", "expires_in": 30 * 86400.0, "description": "ci"}
    client.create_key(expires_at=datetime(2026, 6, 1, tzinfo=UTC))
    assert recorder.json() == {"description": "", "expires_at": "2026-06-01T00:00:00+00:00"}
    with pytest.raises(ValueError):
        client.create_key(expires_in=60, expires_at=datetime(2026, 6, 1, tzinfo=UTC))

    recorder.reply = KEY
    assert client.disable_key("AKTEST").enabled
    assert (recorder.last.method, recorder.last.url.path) == ("POST", "/api/v1/keys/AKTEST/disable")
    recorder.reply = None
    client.delete_key("AKTEST")
    assert (recorder.last.method, recorder.last.url.path) == ("DELETE", "/api/v1/keys/AKTEST")

    recorder.reply = {"items": [KEY]}
    assert [k.id for k in client.list_keys(user="bob")] == ["AKTEST"]
    assert recorder.last.url.params["user"] == "bob"

    user = {
        "id": "usr-2",
        "name": "carol",
        "org_id": "org-1",
        "org_name": "acme",
        "role": "viewer",
        "platform_admin": False,
        "disabled": False,
        "created_at": NOW,
    }
    recorder.reply = user
    client.create_user("carol", role="viewer")
    assert recorder.json() == {"name": "carol", "role": "viewer"}
    client.create_user("carol", org="acme")
    assert recorder.json() == {"name": "carol", "org": "acme", "role": "member"}
    client.enable_user("carol")
    assert recorder.last.url.path == "/api/v1/users/carol/enable"

    recorder.reply = {"id": "org-1", "name": "acme", "created_at": NOW}
    assert client.create_org("acme").name == "acme"
    assert recorder.json() == {"name": "acme"}

    recorder.reply = {"items": []}
    since = datetime(2026, 3, 1, 11, tzinfo=UTC)
    assert client.audit(since=since, action="org.create", limit=10) == []
    params = recorder.last.url.params
    assert dict(params) == {"since": "2026-03-01T11:00:00+00:00", "action": "org.create", "limit": "10"}


def test_server_errors_become_kiln_errors():
    client, _ = signed(Recorder({"code": "forbidden", "message": "viewers cannot submit jobs"}, status=403))
    with pytest.raises(Forbidden, match="viewers"):
        client.list_users()
