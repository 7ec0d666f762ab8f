"""Helpers for the tenancy tests: raw signed (or bearer) requests as one caller, and organisations with users
and keys set up through the real HTTP API.

Deliberately independent of the SDK's tenancy methods: every request is built with httpx and
``kiln.auth.signing.sign_headers``, so a test controls exactly what is sent.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kiln.auth import signing
from tests.kilnserver import KilnServer

API = "/api/v1"
Params = dict[str, Any] | Iterable[tuple[str, str]] | None


def api_path(path: str) -> str:
    """``/jobs`` → ``/api/v1/jobs``; a path already under /api/ (or /healthz) stays as it is."""
    if path.startswith(API + "/") or path == API or not path.startswith("/") or path in ("/healthz", "/readyz"):
        return path
    return API + path


def query_pairs(params: Params) -> list[tuple[str, str]]:
    if params is None:
        return []
    items = params.items() if isinstance(params, dict) else params
    pairs: list[tuple[str, str]] = []
    for key, value in items:
        if value is None:
            continue
        for v in value if isinstance(value, list | tuple) else [value]:
            pairs.append((key, str(v).lower() if isinstance(v, bool) else str(v)))
    return pairs


class Api:
    """One caller of one server: signed with an access key, or carrying a job token (``token=``), or nothing."""

    def __init__(
        self,
        url: str,
        access_key: str = "",
        secret_key: str = "",
        *,
        token: str = "",
        label: str = "",
        timeout: float = 30,
    ) -> None:
        self.url = url.rstrip("/")
        self.access_key = access_key
        self.secret_key = secret_key
        self.token = token
        self.label = label or access_key or ("job-token" if token else "anonymous")
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

    @classmethod
    def admin(cls, server: KilnServer, url: str | None = None) -> Api:
        creds = server.credentials()
        return cls(url or server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"], label="platform-admin")

    def close(self) -> None:
        self.http.close()

    def headers(
        self,
        method: str,
        path: str,
        query: str = "",
        body: bytes = b"",
        *,
        unsigned: bool = False,
        date: int | None = None,
        nonce: str | None = None,
        secret_key: str | None = None,
    ) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if not self.access_key:
            return {}
        raw_path = httpx.URL(self.url + path).raw_path.decode()
        return signing.sign_headers(
            access_key=self.access_key,
            secret_key=secret_key or self.secret_key,
            method=method,
            path=raw_path,
            query=query,
            content_sha256=signing.UNSIGNED_PAYLOAD if unsigned else signing.body_sha256(body),
            date=date,
            nonce=nonce,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json_body: Any = None,
        content: bytes | None = None,
        content_type: str | None = None,
        unsigned: bool = False,
        date: int | None = None,
        secret_key: str | None = None,
    ) -> httpx.Response:
        return self.http.send(
            self.build(
                method,
                path,
                params=params,
                json_body=json_body,
                content=content,
                content_type=content_type,
                unsigned=unsigned,
                date=date,
                secret_key=secret_key,
            )
        )

    def build(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json_body: Any = None,
        content: bytes | None = None,
        content_type: str | None = None,
        unsigned: bool = False,
        date: int | None = None,
        secret_key: str | None = None,
    ) -> httpx.Request:
        """The request, signed (or with the bearer token), not sent."""
        path = api_path(path)
        query = signing.canonical_query(query_pairs(params))
        body = json.dumps(json_body).encode() if json_body is not None else (content or b"")
        headers = self.headers(method, path, query, body, unsigned=unsigned, date=date, secret_key=secret_key)
        if json_body is not None:
            headers["Content-Type"] = "application/json"
        elif content_type:
            headers["Content-Type"] = content_type
        target = path + (f"?{query}" if query else "")
        return self.http.build_request(method, target, headers=headers, content=body)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, json_body: Any = None, **kw: Any) -> httpx.Response:
        return self.request("POST", path, json_body=json_body, **kw)

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        """The request must succeed (2xx); its JSON body (or None)."""
        response = self.request(method, path, **kw)
        assert response.status_code < 300, f"{self.label}: {method} {path} → {response.status_code} {response.text}"
        return response.json() if response.content and "json" in response.headers.get("content-type", "") else None

    # -- jobs ---------------------------------------------------------------------------------------

    def submit(self, command: str | list[str], **spec: Any) -> dict[str, Any]:
        return self.ok("POST", "/jobs", json_body={"spec": job_spec(command, **spec)})  # type: ignore[no-any-return]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.ok("GET", f"/jobs/{job_id}")  # type: ignore[no-any-return]

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return self.ok("GET", f"/jobs/{job_id}/events")["items"]  # type: ignore[no-any-return]

    def wait(self, job_id: str, *states: str, timeout: float = 30, poll: float = 0.05) -> dict[str, Any]:
        """Poll until the job is in one of ``states`` (default: any end state)."""
        ends = {"SUCCEEDED", "FAILED", "CANCELLED"}
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if (states and job["state"] in states) or (not states and job["state"] in ends):
                return job
            if states and job["state"] in ends:
                raise AssertionError(f"job {job_id} ended {job['state']} ({job['message']}); wanted {states}")
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {job['state']} ({job['message']}) after {timeout}s")
            time.sleep(poll)

    def wait_message(self, job_id: str, prefix: str, timeout: float = 20) -> dict[str, Any]:
        """Poll until the job's message starts with ``prefix``."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if (job.get("message") or "").startswith(prefix):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id}: message {job.get('message')!r} never started with {prefix!r}")
            time.sleep(0.05)

    def audit(self, **params: Any) -> list[dict[str, Any]]:
        params.setdefault("limit", 1000)
        return self.ok("GET", "/audit", params=params)["items"]  # type: ignore[no-any-return]

    def audit_until(self, found: Any, timeout: float = 3, **params: Any) -> list[dict[str, Any]]:
        """The audit records (filtered by ``params``) once ``found(records)`` holds; the last ones after
        ``timeout``. The server writes a record just after its response went out, so it may lag a moment."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.audit(**params)
            if found(records) or time.monotonic() > deadline:
                return records
            time.sleep(0.05)


def job_spec(command: str | list[str], **extra: Any) -> dict[str, Any]:
    """A spec run with this interpreter (no runtime venv to build)."""
    return {"command": command, "runtime": {"python": sys.executable}, **extra}


def tar_gz(members: dict[str, bytes]) -> tuple[bytes, str]:
    """A code bundle and its sha256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


# -- organisations, users, keys ---------------------------------------------------------------------------


@dataclass
class Account:
    """A user of an organisation with one access key."""

    role: str
    user_id: str
    user_name: str
    key_id: str
    secret: str
    api: Api


@dataclass
class Tenant:
    id: str
    name: str
    accounts: dict[str, Account] = field(default_factory=dict)

    def __getitem__(self, role: str) -> Account:
        return self.accounts[role]


def create_key(creator: Api, url: str, user: str, label: str, **body: Any) -> tuple[str, str, Api]:
    """A new key for ``user`` made by ``creator``: (key id, secret, a caller signing with it)."""
    key = creator.ok("POST", "/keys", json_body={"user": user, **body})
    assert key["secret_key"], key
    return key["id"], key["secret_key"], Api(url, key["id"], key["secret_key"], label=label)


def create_tenant(admin: Api, name: str, roles: Iterable[str] = ("admin", "member", "viewer")) -> Tenant:
    """An organisation ``name`` with one user per role (named ``<name>-<role>``), each with a key."""
    org = admin.ok("POST", "/orgs", json_body={"name": name})
    tenant = Tenant(org["id"], org["name"])
    for role in roles:
        user_name = f"{name}-{role}"
        user = admin.ok("POST", "/users", json_body={"name": user_name, "org": name, "role": role})
        key_id, secret, api = create_key(admin, admin.url, user_name, label=f"{name}/{role}")
        tenant.accounts[role] = Account(role, user["id"], user_name, key_id, secret, api)
    return tenant


def close_all(*tenants: Tenant) -> None:
    for tenant in tenants:
        for account in tenant.accounts.values():
            account.api.close()
