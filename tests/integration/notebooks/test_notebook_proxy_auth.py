"""The notebook proxy (``/notebooks/{id}/…``) authenticates a request on its headers before it reads any of its
body, and audits a refused authentication as ``/api/v1`` does. No notebook runs here: every request below is
refused before the proxy looks one up."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from kiln.api.session import COOKIE
from kiln.auth import signing
from kiln.auth.secrets import new_access_key_id
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant

MiB = 1024 * 1024
PATH = "/notebooks/nb-x/api/contents"


@dataclass
class World:
    server: KilnServer
    admin: Api
    tenant: Tenant


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    server = KilnServer(tmp_path_factory.mktemp("proxyauth") / "home").start()
    admin = Api.admin(server)
    tenant = create_tenant(admin, "proxy-auth", ("member", "viewer"))
    try:
        yield World(server, admin, tenant)
    finally:
        close_all(tenant)
        admin.close()
        server.stop()


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (the peak since the process started) of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0])
    return out


def megabytes(total: int, chunk: int = MiB) -> Iterator[bytes]:
    """A body streamed by the client (chunked: no Content-Length), never held whole on this side either."""
    block = b"x" * chunk
    for _ in range(total // chunk):
        yield block


@pytest.mark.timeout(180)
@pytest.mark.parametrize("credentials", ["none", "forged cookie", "bad signature"])
def test_a_250_mb_body_is_refused_before_it_is_read(world: World, credentials: str) -> None:
    assert world.server.proc is not None
    pid = world.server.proc.pid
    before = memory_kib(pid)
    peak = [before["VmRSS"]]
    done = threading.Event()

    def sample() -> None:  # the server's RSS while the body is on its way
        while not done.wait(0.01):
            peak.append(memory_kib(pid)["VmRSS"])

    headers: dict[str, str] = {}
    if credentials == "forged cookie":
        headers["Cookie"] = f"{COOKIE}=v1.AK000000000000000000.9999999999.{'0' * 64}"
    elif credentials == "bad signature":
        headers = signing.sign_headers(
            access_key=new_access_key_id(),  # no such key: the records the tests below count are not this one's
            secret_key="not-the-secret",
            method="POST",
            path=PATH,
            query="",
            content_sha256=signing.body_sha256(b"what was signed"),
        )
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        with httpx.Client(base_url=world.server.url, timeout=120) as http:
            response = http.post(PATH, content=megabytes(250 * MiB), headers=headers)
    finally:
        elapsed = time.monotonic() - started
        done.set()
        sampler.join()
    after = memory_kib(pid)
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "unauthenticated"
    grown = (max(peak) - before["VmRSS"]) / 1024
    assert grown < 50, f"the server's RSS grew by {grown:.0f} MB while it refused the body"
    # The peak since the server started, which no sample can miss: no higher than 50 MB above where it was.
    assert after["VmHWM"] < max(before["VmHWM"], before["VmRSS"] + 50 * 1024), (before, after)
    assert elapsed < 60, elapsed


@pytest.mark.timeout(60)
def test_a_content_length_over_the_cap_is_413_unread(world: World) -> None:
    declared = 300 * MiB  # over the proxy's cap (256 MiB): refused on the header, before any byte of the body
    # A raw socket: the request declares 300 MiB and sends none of it, and the answer must come all the same (an
    # HTTP client would refuse to send a body shorter than its Content-Length, or race the answer while sending).
    host, port = world.server.url.removeprefix("http://").split(":")
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {declared}\r\nCookie: {COOKIE}=x\r\n\r\n"
    )
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection without an answer: {answer!r}"
            answer += chunk
    status_line = answer.split(b"\r\n", 1)[0].decode()
    assert status_line.split(" ")[1] == "413", status_line
    assert time.monotonic() - started < 10


def unauthenticated_records(world: World, key_id: str, expect: int) -> list[dict[str, Any]]:
    records = world.admin.audit_until(
        lambda rs: sum(r["key_id"] == key_id for r in rs) >= expect, outcome="unauthenticated"
    )
    return sorted((r for r in records if r["key_id"] == key_id), key=lambda r: r["action"])


def same_but_action(proxy: dict[str, Any], api: dict[str, Any]) -> None:
    keys = ("outcome", "status", "detail", "client", "org_id", "user_id", "key_id")
    assert {k: proxy[k] for k in keys} == {k: api[k] for k in keys}, (proxy, api)


def sign_in(world: World, key_id: str, secret: str) -> str:
    with httpx.Client(base_url=world.server.url, timeout=30) as http:
        response = http.post("/api/v1/session", json={"key_id": key_id, "secret": secret})
        assert response.status_code == 200, response.text
        token = response.cookies.get(COOKIE)
    assert token
    return str(token)


@pytest.mark.timeout(60)
def test_a_forged_cookie_on_the_proxy_is_audited_as_on_the_api(world: World) -> None:
    viewer = world.tenant["viewer"]
    version, key_id, expiry, mac = sign_in(world, viewer.key_id, viewer.secret).split(".")
    forged = f"{version}.{key_id}.{int(expiry) + 86400}.{mac}"  # a longer session under the same MAC
    with httpx.Client(base_url=world.server.url, timeout=30) as http:
        on_proxy = http.get("/notebooks/nb-x/lab", headers={"Cookie": f"{COOKIE}={forged}"})
        on_api = http.get("/api/v1/jobs", headers={"Cookie": f"{COOKIE}={forged}"})
    for response in (on_proxy, on_api):
        assert response.status_code == 401, response.text
        assert response.json()["details"]["reason"] == "signature"
    api, proxy = unauthenticated_records(world, viewer.key_id, 2)
    assert (proxy["action"], proxy["resource"]) == ("GET /notebooks/nb-x/lab", "/notebooks/nb-x/lab"), proxy
    assert (api["action"], api["resource"]) == ("GET /api/v1/jobs", "/api/v1/jobs"), api
    same_but_action(proxy, api)
    assert (proxy["key_id"], proxy["detail"]) == (viewer.key_id, "signature"), proxy


@pytest.mark.timeout(60)
def test_a_bad_signature_and_a_tampered_body_on_the_proxy_are_audited_as_on_the_api(world: World) -> None:
    member = world.tenant["member"]
    api = member.api
    refused = []
    for path in ("/api/v1/jobs", PATH):
        headers = api.headers("POST", path, body=b"{}", secret_key="not-the-secret")
        refused.append(api.http.post(path, headers=headers, content=b"{}"))
    for response in refused:
        assert response.status_code == 401, response.text
        assert response.json()["details"]["reason"] == "signature"
    on_api, on_proxy = unauthenticated_records(world, member.key_id, 2)
    assert on_proxy["action"] == f"POST {PATH}" and on_proxy["resource"] == PATH, on_proxy
    same_but_action(on_proxy, on_api)
    assert (on_proxy["user_id"], on_proxy["detail"]) == (member.user_id, "signature")
    # Signed right, but the body is not what was signed: read and hashed, refused before it goes anywhere.
    headers = api.headers("POST", PATH, body=b"what was signed")
    tampered = api.http.post(PATH, headers=headers, content=b"something else")
    assert tampered.status_code == 401, tampered.text
    assert tampered.json()["details"]["reason"] == "body_hash"
    records = unauthenticated_records(world, member.key_id, 3)
    assert sorted(r["detail"] for r in records if r["action"] == f"POST {PATH}") == ["body_hash", "signature"]


@pytest.mark.timeout(60)
def test_a_signed_body_over_the_apis_cap_is_413(world: World) -> None:
    api = world.tenant["member"].api
    body = b"x" * (17 * MiB)  # over limits.MAX_SIGNED_BODY_BYTES (16 MiB), as a signed /api/v1 body is
    headers = api.headers("PUT", PATH, body=body)
    response = api.http.put(PATH, headers=headers, content=body)
    assert response.status_code == 413, response.text
