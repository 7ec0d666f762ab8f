"""The web console's sign-in against real servers: the session cookie and its flags, cookie-authenticated requests
with the API's roles and organisation isolation, the CSRF token on every change, a session that dies with its key
or on another server's key, sign-out, the signed API as before, and the built console served at / (a bundle the
test writes: KILN_CONSOLE_DIR)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from kiln.auth.sessions import COOKIE, CSRF_HEADER
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_key, create_tenant, job_spec

INDEX = "<!doctype html><title>Kiln console (test bundle)</title><script type=module src=/assets/app-5e1f.js></script>"
ASSET = "document.title = 'kiln';"


class Browser:
    """What the console does in a browser: a cookie jar, and the CSRF token kept from the sign-in."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)
        self.csrf = ""

    def sign_in(self, key_id: str, secret: str) -> httpx.Response:
        response = self.http.post("/api/v1/session", json={"key_id": key_id, "secret": secret})
        if response.status_code == 200:
            self.csrf = response.json()["csrf_token"]
        return response

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(path, **kw)

    def send(self, method: str, path: str, *, csrf: str | None = None, **kw: Any) -> httpx.Response:
        """A change, with ``csrf`` as X-Kiln-CSRF (None: the session's; "": no such header)."""
        value = self.csrf if csrf is None else csrf
        return self.http.request(method, path, headers={CSRF_HEADER: value} if value else {}, **kw)

    @property
    def cookie(self) -> str | None:
        return self.http.cookies.get(COOKIE)

    def close(self) -> None:
        self.http.close()


@dataclass
class World:
    server: KilnServer
    admin: Api
    alpha: Tenant
    bravo: Tenant
    dist: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("console")
    dist = root / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text(INDEX)
    (dist / "assets" / "app-5e1f.js").write_text(ASSET)
    server = KilnServer(root / "home", console_dir=str(dist)).start()
    admin = Api.admin(server)
    alpha = create_tenant(admin, "console-alpha", ("member", "viewer"))
    bravo = create_tenant(admin, "console-bravo", ("member",))
    try:
        yield World(server, admin, alpha, bravo, dist)
    finally:
        close_all(alpha, bravo)
        admin.close()
        server.stop()


@pytest.fixture
def browser(world: World) -> Iterator[Browser]:
    browser = Browser(world.server.url)
    yield browser
    browser.close()


def signed_in(world: World, key_id: str, secret: str) -> Browser:
    browser = Browser(world.server.url)
    response = browser.sign_in(key_id, secret)
    assert response.status_code == 200, response.text
    return browser


def assert_401(response: httpx.Response, reason: str | None = None) -> None:
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "unauthenticated"
    if reason is not None:
        assert response.json()["details"]["reason"] == reason, response.text


def test_signing_in_sets_an_httponly_strict_cookie_and_answers_the_caller(world: World, browser: Browser) -> None:
    member = world.alpha["member"]
    response = browser.sign_in(member.key_id, member.secret)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["user"]["user_id"] == member.user_id and body["user"]["org_name"] == "console-alpha"
    assert body["user"]["role"] == "member" and body["user"]["platform_admin"] is False
    assert body["csrf_token"] and body["expires_at"]
    (cookie,) = response.headers.get_list("set-cookie")
    name, _, rest = cookie.partition("=")
    token, *flags = [part.strip() for part in rest.split(";")]
    assert name == COOKIE and token.startswith(f"v1.{member.key_id}.")
    assert {"HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"} <= set(flags), cookie
    assert "Secure" not in flags  # plain http here; over https it is added
    assert member.secret not in cookie and member.secret not in response.text
    assert response.headers["cache-control"] == "no-store"

    again = browser.get("/api/v1/session")
    assert again.status_code == 200, again.text
    assert again.json() == body  # the same caller, the same CSRF token, the same end


def test_a_cookie_reads_the_api_as_its_key_would_and_only_its_organisation(world: World) -> None:
    alpha, bravo = world.alpha["member"], world.bravo["member"]
    mine = alpha.api.submit("true", name="alpha-console-job")
    theirs = bravo.api.submit("true", name="bravo-console-job")
    browser = signed_in(world, alpha.key_id, alpha.secret)
    try:
        listed = browser.get("/api/v1/jobs")
        assert listed.status_code == 200, listed.text
        ids = {job["id"] for job in listed.json()["items"]}
        assert mine["id"] in ids and theirs["id"] not in ids
        assert browser.get(f"/api/v1/jobs/{mine['id']}").status_code == 200
        assert browser.get(f"/api/v1/jobs/{theirs['id']}").status_code == 404
        whoami = browser.get("/api/v1/whoami").json()
        assert (whoami["user_id"], whoami["access_key"]) == (alpha.user_id, alpha.key_id)
        alpha.api.wait(mine["id"])
        logs = browser.get(f"/api/v1/jobs/{mine['id']}/logs", params={"follow": "true"})
        assert logs.status_code == 200, logs.text  # the follow stream ends with the finished job
    finally:
        browser.close()


def test_a_change_needs_the_csrf_token(world: World) -> None:
    member = world.alpha["member"]
    browser = signed_in(world, member.key_id, member.secret)
    spec = {"spec": job_spec("true", name="csrf-job")}
    try:
        missing = browser.send("POST", "/api/v1/jobs", csrf="", json=spec)
        assert missing.status_code == 403, missing.text
        assert missing.json()["code"] == "csrf" and CSRF_HEADER in missing.json()["message"]
        wrong = browser.send("POST", "/api/v1/jobs", csrf="0" * 64, json=spec)
        assert wrong.status_code == 403 and wrong.json()["code"] == "csrf", wrong.text
        names = [job["name"] for job in member.api.ok("GET", "/jobs")["items"]]
        assert "csrf-job" not in names  # refused before any route ran

        created = browser.send("POST", "/api/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["user_id"] == member.user_id
        cancelled = browser.send("POST", f"/api/v1/jobs/{job['id']}/cancel")
        assert cancelled.status_code in (200, 409), cancelled.text  # 409: it had already ended
        records = world.admin.audit_until(
            lambda rs: any(r["detail"] == "csrf" for r in rs), user=member.user_id, outcome="denied"
        )
        assert any(r["detail"] == "csrf" and r["resource"] == "/api/v1/jobs" for r in records), records
    finally:
        browser.close()


def test_a_viewers_cookie_can_read_and_change_nothing(world: World) -> None:
    viewer, member = world.alpha["viewer"], world.alpha["member"]
    job = member.api.submit("true", name="viewer-sees-it")
    browser = signed_in(world, viewer.key_id, viewer.secret)
    try:
        assert browser.get("/api/v1/session").json()["user"]["role"] == "viewer"
        assert browser.get(f"/api/v1/jobs/{job['id']}").status_code == 200
        submit = browser.send("POST", "/api/v1/jobs", json={"spec": job_spec("true")})
        cancel = browser.send("POST", f"/api/v1/jobs/{job['id']}/cancel")
        delete = browser.send("DELETE", f"/api/v1/jobs/{job['id']}")
        key = browser.send("POST", "/api/v1/keys", json={"description": "a viewer's own key"})
        for refused in (submit, cancel, delete, key):
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "forbidden"
    finally:
        browser.close()


def test_a_wrong_pair_is_refused_and_audited(world: World, browser: Browser) -> None:
    member = world.alpha["member"]
    wrong = member.secret[:-1] + ("x" if member.secret[-1] != "x" else "y")
    assert_401(browser.sign_in(member.key_id, wrong), "signature")
    assert browser.cookie is None
    assert_401(browser.sign_in("AK" + "0" * 18, member.secret), "unknown_key")
    bad = browser.http.post("/api/v1/session", json={"key_id": "nope", "secret": "x"})
    assert bad.status_code == 422 and "key_id" in bad.text
    records = world.admin.audit_until(
        lambda rs: any(r["key_id"] == member.key_id for r in rs), outcome="unauthenticated"
    )
    mine = [r for r in records if r["key_id"] == member.key_id and r["action"] == "POST /api/v1/session"]
    assert mine and mine[0]["detail"] == "signature" and mine[0]["org_id"] == world.alpha.id


def test_the_session_dies_with_its_key(world: World) -> None:
    member = world.alpha["member"]
    key_id, secret, api = create_key(world.admin, world.server.url, member.user_id, label="short-lived")
    browser = signed_in(world, key_id, secret)
    try:
        assert browser.get("/api/v1/jobs").status_code == 200
        world.admin.ok("POST", f"/keys/{key_id}/disable")
        assert_401(browser.get("/api/v1/session"), "key_disabled")
        assert_401(browser.get("/api/v1/jobs"), "key_disabled")
        assert_401(browser.sign_in(key_id, secret), "key_disabled")
        world.admin.ok("DELETE", f"/keys/{key_id}")
        assert_401(browser.get("/api/v1/jobs"), "unknown_key")
    finally:
        browser.close()
        api.close()


def test_a_tampered_cookie_is_refused(world: World, browser: Browser) -> None:
    member, bravo = world.alpha["member"], world.bravo["member"]
    assert browser.sign_in(member.key_id, member.secret).status_code == 200
    token = browser.cookie
    assert token is not None
    version, _, expiry, mac = token.split(".")
    forged = httpx.Client(base_url=world.server.url, timeout=30)
    try:
        for value, reason in (
            (f"{version}.{bravo.key_id}.{expiry}.{mac}", "signature"),  # another user's key under this MAC
            (f"{version}.{member.key_id}.{int(expiry) + 86400}.{mac}", "signature"),
            ("not-a-session", "malformed"),
        ):
            assert_401(forged.get("/api/v1/jobs", headers={"Cookie": f"{COOKIE}={value}"}), reason)
    finally:
        forged.close()


def test_signing_out_clears_the_cookie(world: World, browser: Browser) -> None:
    member = world.alpha["member"]
    assert browser.sign_in(member.key_id, member.secret).status_code == 200
    assert browser.get("/api/v1/session").status_code == 200
    response = browser.http.delete("/api/v1/session")
    assert response.status_code == 204
    cleared = response.headers["set-cookie"]
    assert cleared.startswith(f"{COOKIE}=;") and "Max-Age=0" in cleared
    assert browser.cookie is None
    assert_401(browser.get("/api/v1/session"), "missing_headers")
    assert browser.http.delete("/api/v1/session").status_code == 204  # also without a session


def test_asking_for_the_session_without_credentials_is_not_a_failed_authentication(
    world: World, browser: Browser
) -> None:
    """The console asks GET /api/v1/session whenever its sign-in page loads: without any credentials that is a
    question, answered 401 as before but neither logged as a WARNING nor audited (issue 26); a request that
    offers a credential and fails still is, on that route as on any other."""
    log_from = world.server.log_path.stat().st_size
    assert_401(browser.get("/api/v1/session"), "missing_headers")
    assert_401(browser.get("/api/v1/session", headers={"Cookie": f"{COOKIE}=not-a-session"}), "malformed")
    assert_401(browser.get("/api/v1/session", headers={"X-Kiln-Date": "1"}), "missing_headers")  # half signed

    def session_rows(records: list[dict[str, Any]]) -> list[str]:
        return sorted(r["detail"] for r in records if r["action"] == "GET /api/v1/session")

    records = world.admin.audit_until(lambda rs: len(session_rows(rs)) >= 2, outcome="unauthenticated")
    time.sleep(0.3)  # a record of the first request, were there one, would be written by now
    records = world.admin.audit(outcome="unauthenticated")
    assert [d for d in session_rows(records) if d in ("missing_headers", "malformed")] == [
        "malformed",
        "missing_headers",
    ], records
    logged = world.server.log_path.read_bytes()[log_from:].decode(errors="replace")
    warned = [line for line in logged.splitlines() if "401 GET /api/v1/session" in line]
    assert len(warned) == 2 and "malformed" in warned[0] and "missing_headers" in warned[1], logged


def test_the_signed_api_is_unchanged_and_a_signature_beats_a_cookie(world: World) -> None:
    member, bravo = world.alpha["member"], world.bravo["member"]
    browser = signed_in(world, bravo.key_id, bravo.secret)
    token = browser.cookie
    browser.close()
    api = member.api
    with_cookie = api.build("GET", "/whoami")
    with_cookie.headers["Cookie"] = f"{COOKIE}={token}"
    answer = api.http.send(with_cookie)
    assert answer.status_code == 200 and answer.json()["user_id"] == member.user_id  # the signer, not the cookie
    tampered = api.build("GET", "/whoami", secret_key=member.secret[::-1])
    tampered.headers["Cookie"] = f"{COOKIE}={token}"
    assert_401(api.http.send(tampered), "signature")  # a bad signature is not rescued by a good cookie
    signed_session = api.request("GET", "/session")
    assert_401(signed_session)  # a signed request has no console session
    assert "no console session" in signed_session.json()["message"]
    assert_401(httpx.get(world.server.url + "/api/v1/jobs", timeout=30), "missing_headers")


def test_the_built_console_is_served_at_the_root(world: World, browser: Browser) -> None:
    for path in ("/", "/jobs", "/jobs/job-123/logs"):
        page = browser.get(path)
        assert page.status_code == 200, path
        assert page.text == INDEX and page.headers["content-type"].startswith("text/html")
        assert page.headers["cache-control"] == "no-cache"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    asset = browser.get("/assets/app-5e1f.js")
    assert asset.status_code == 200 and asset.text == ASSET
    assert "javascript" in asset.headers["content-type"]
    assert asset.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert browser.get("/assets/app-0000.js").status_code == 404
    api_404 = world.alpha["member"].api.request("GET", "/api/v1/no-such-route")
    assert api_404.status_code == 404 and api_404.json()["code"] == "not_found"
    assert browser.get("/healthz").json() == {"status": "ok"}  # routes keep their paths
    assert browser.http.post("/").status_code in (404, 405)


def test_a_cookie_is_useless_on_a_server_with_another_key_and_no_console_means_api_only(
    make_server: Any, postgres_url: str, tmp_path: Path
) -> None:
    """Two servers on one database (their keys and users shared): one with KILN_SERVER_KEY, one with its home's
    own server.key. A session of the first is refused by the second for its MAC, before any key is read. The first
    allows each key a burst of 4 requests (its half of 8, with two servers live): sign-ins, refused ones too, count
    against it."""
    key = Fernet.generate_key().decode()
    limits = {"rate_limit_burst": "8", "rate_limit_per_second": "0.01", "server_heartbeat_seconds": "0.5"}
    first = make_server(postgres_url, server_key=key, **limits)
    empty = tmp_path / "no-console"
    empty.mkdir()
    second = make_server(postgres_url, console_dir=str(empty))
    assert (second.home / "server.key").read_text().strip() != key
    deadline = time.monotonic() + 30
    while httpx.get(first.url + "/readyz", timeout=10).json()["servers"] != 2:  # it counts the second
        assert time.monotonic() < deadline, "the first server never counted the second"
        time.sleep(0.1)
    creds = first.credentials()
    browser = Browser(first.url)
    other = httpx.Client(base_url=second.url, timeout=30)
    try:
        assert browser.sign_in(creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"]).status_code == 200
        assert browser.get("/api/v1/jobs").status_code == 200
        refused = other.get("/api/v1/jobs", headers={"Cookie": f"{COOKIE}={browser.cookie}"})
        assert_401(refused, "signature")
        assert "not made by this server" in refused.json()["message"]
        wrong = creds["KILN_SECRET_KEY"][::-1]
        assert_401(browser.sign_in(creds["KILN_ACCESS_KEY"], wrong), "signature")  # the 3rd request of the key
        assert browser.get("/api/v1/session").status_code == 200  # the 4th
        limited = browser.sign_in(creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1, limited.text

        root = other.get("/")
        assert root.status_code == 404 and "console not built: run `make console`" in root.json()["message"]
        assert "console not built: run `make console`" in second.log()
    finally:
        browser.close()
        other.close()
