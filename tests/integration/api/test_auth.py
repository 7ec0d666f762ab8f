"""Signed requests against a real server: every part of a request is covered by the signature.

Requests are built by hand (httpx + kiln.auth.signing.sign_headers) so each test controls exactly what is signed
and what is sent.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln.auth import signing
from tests.kilnserver import KilnServer

EMPTY_SHA = hashlib.sha256(b"").hexdigest()


class Signer:
    """Signs and sends raw requests to one server as its admin."""

    def __init__(self, server: KilnServer) -> None:
        self.server = server
        creds = server.credentials()
        self.access_key = creds["KILN_ACCESS_KEY"]
        self.secret_key = creds["KILN_SECRET_KEY"]
        self.http = httpx.Client(base_url=server.url, timeout=30)

    def headers(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes = b"",
        content_sha256: str | None = None,
        date: int | None = None,
        nonce: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> dict[str, str]:
        return signing.sign_headers(
            access_key=access_key or self.access_key,
            secret_key=secret_key or self.secret_key,
            method=method,
            path=path,
            query=query,
            content_sha256=content_sha256 or signing.body_sha256(body),
            date=date,
            nonce=nonce,
        )

    def send(self, method: str, url: str, headers: dict[str, Any], content: Any = b"") -> httpx.Response:
        return self.http.request(method, url, headers=headers, content=content)

    def call(self, method: str, path: str, *, query: str = "", body: bytes = b"", **sign: Any) -> httpx.Response:
        """A correctly signed request."""
        headers = self.headers(method, path, query=query, body=body, **sign)
        if body:
            headers["Content-Type"] = "application/json"
        return self.send(method, path + (f"?{query}" if query else ""), headers, body)

    def post_json(self, path: str, data: Any) -> httpx.Response:
        return self.call("POST", path, body=json.dumps(data).encode())

    def assert_401(self, response: httpx.Response, reason: str) -> None:
        assert response.status_code == 401, response.text
        body = response.json()
        assert body["code"] == "unauthenticated"
        assert body["details"]["reason"] == reason
        assert self.secret_key not in response.text
        assert all(self.secret_key not in v for v in response.headers.values())


@pytest.fixture(scope="module")
def api(shared_server: KilnServer) -> Iterator[Signer]:
    signer = Signer(shared_server)
    yield signer
    signer.http.close()


def job_body(command: str = "echo hi") -> bytes:
    return json.dumps({"spec": {"command": command, "runtime": {"python": sys.executable}}}).encode()


# -- the good path ------------------------------------------------------------------------------------------------


def test_signed_whoami(api: Signer) -> None:
    response = api.call("GET", "/api/v1/whoami")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["access_key"] == api.access_key
    assert (body["user_name"], body["org_name"], body["platform_admin"]) == ("admin", "admin", True)
    assert body["user_id"].startswith("usr-") and body["org_id"].startswith("org-")


def test_signed_post_creates_a_job(api: Signer) -> None:
    response = api.call("POST", "/api/v1/jobs", body=job_body())
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["id"].startswith("job-")
    assert job["spec"]["command"] == "echo hi"
    assert api.call("GET", f"/api/v1/jobs/{job['id']}").json()["id"] == job["id"]


def test_query_is_canonicalised_by_the_server(api: Signer) -> None:
    # Signed canonical (sorted, %20), sent in another order and with '+' for the space: the server canonicalises.
    query = signing.canonical_query([("state", "QUEUED"), ("limit", "5"), ("before", "job 1")])
    assert query == "before=job%201&limit=5&state=QUEUED"
    headers = api.headers("GET", "/api/v1/jobs", query=query)
    response = api.send("GET", "/api/v1/jobs?state=QUEUED&before=job+1&limit=5", headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"items": []}


def test_percent_encoded_path_is_signed_as_sent(api: Signer) -> None:
    response = api.call("GET", "/api/v1/jobs/job%20x")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_dates_inside_the_window_are_accepted(api: Signer) -> None:
    now = int(time.time())
    assert api.call("GET", "/api/v1/whoami", date=now - 250).status_code == 200
    assert api.call("GET", "/api/v1/whoami", date=now + 250).status_code == 200


# -- tampering ----------------------------------------------------------------------------------------------------


def test_tampered_body_is_refused(api: Signer) -> None:
    headers = api.headers("POST", "/api/v1/jobs", body=job_body("echo signed"))
    headers["Content-Type"] = "application/json"
    response = api.send("POST", "/api/v1/jobs", headers, job_body("rm -rf ~"))
    api.assert_401(response, "body_hash")


def test_body_hash_header_changed_to_match_a_new_body_is_refused(api: Signer) -> None:
    headers = api.headers("POST", "/api/v1/jobs", body=job_body("echo signed"))
    headers["X-Kiln-Content-SHA256"] = signing.body_sha256(job_body("echo evil"))
    headers["Content-Type"] = "application/json"
    api.assert_401(api.send("POST", "/api/v1/jobs", headers, job_body("echo evil")), "signature")


def test_tampered_path_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/whoami")
    api.assert_401(api.send("GET", "/api/v1/jobs", headers), "signature")


def test_tampered_query_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/jobs", query="limit=5")
    api.assert_401(api.send("GET", "/api/v1/jobs?limit=6", headers), "signature")


def test_added_query_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/jobs")
    api.assert_401(api.send("GET", "/api/v1/jobs?state=FAILED", headers), "signature")


def test_changed_method_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/jobs")
    api.assert_401(api.send("POST", "/api/v1/jobs", headers), "signature")


def test_get_signature_is_not_valid_for_head(api: Signer) -> None:
    path = f"/api/v1/blobs/{'a' * 64}"
    headers = api.headers("GET", path)
    response = api.send("HEAD", path, headers)
    assert response.status_code == 401  # a HEAD response has no body to inspect


def test_tampered_date_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/whoami")
    headers["X-Kiln-Date"] = str(int(headers["X-Kiln-Date"]) - 1)
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "signature")


def test_tampered_nonce_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/whoami", nonce="original-nonce-0001")
    headers["X-Kiln-Nonce"] = "tampered-nonce-0001"
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "signature")


# -- replay, time, keys -------------------------------------------------------------------------------------------


def test_replayed_request_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/whoami")
    assert api.send("GET", "/api/v1/whoami", headers).status_code == 200
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "replayed")


def test_a_nonce_is_single_use_across_requests(api: Signer) -> None:
    nonce = "reused-nonce-" + signing.new_nonce()[:20]
    assert api.call("GET", "/api/v1/whoami", nonce=nonce).status_code == 200
    api.assert_401(api.call("GET", "/api/v1/jobs", nonce=nonce), "replayed")


def test_a_refused_request_does_not_burn_its_nonce(api: Signer) -> None:
    nonce = "unburnt-nonce-" + signing.new_nonce()[:20]
    api.assert_401(api.call("GET", "/api/v1/whoami", nonce=nonce, secret_key="wrong"), "signature")
    assert api.call("GET", "/api/v1/whoami", nonce=nonce).status_code == 200


# Just outside the 300 s window. A date in the future comes closer to the server's clock with every moment the
# request takes, and int() drops up to a second: +301 was inside the window by the time a loaded server read it.
@pytest.mark.parametrize("offset", [-301, 306, -100_000])
def test_stale_dates_are_refused(api: Signer, offset: int) -> None:
    api.assert_401(api.call("GET", "/api/v1/whoami", date=int(time.time()) + offset), "stale")


def test_wrong_secret_is_refused(api: Signer) -> None:
    api.assert_401(
        api.call(
            "GET", "/api/v1/whoami", secret_key=api.secret_key[:-1] + ("y" if api.secret_key.endswith("x") else "x")
        ),
        "signature",
    )


def test_an_unknown_access_key_and_a_wrong_secret_are_named_as_such(api: Signer) -> None:
    # Access key ids are public (every request carries one): like AWS's InvalidAccessKeyId, an unknown one is said
    # to be unknown, so a user knows to check the key id rather than the secret. Nothing is said about a secret.
    unknown = api.call("GET", "/api/v1/whoami", access_key="AKNOSUCHKEY000000000")
    api.assert_401(unknown, "unknown_key")
    assert unknown.json()["message"] == "the access key id you provided does not exist: AKNOSUCHKEY000000000"
    wrong = api.call("GET", "/api/v1/whoami", secret_key="not-the-secret")
    api.assert_401(wrong, "signature")
    message = wrong.json()["message"]
    assert message == f"the signature does not match: the secret key does not match access key {api.access_key}"
    assert "not-the-secret" not in wrong.text


def test_a_stale_answer_says_how_far_the_clock_is_off(api: Signer) -> None:
    sent = int(time.time()) - 1000
    response = api.call("GET", "/api/v1/whoami", date=sent)
    api.assert_401(response, "stale")
    details = response.json()["details"]
    assert details["request_time"] == sent and details["max_skew_seconds"] == 300
    assert abs(details["server_time"] - time.time()) < 30
    skew = details["server_time"] - sent
    assert f"is {skew} s behind the server's clock ({details['server_time']}, " in response.json()["message"]


# -- missing and malformed headers --------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Authorization", "X-Kiln-Date", "X-Kiln-Nonce", "X-Kiln-Content-SHA256"])
def test_each_missing_header_is_refused(api: Signer, header: str) -> None:
    headers = api.headers("GET", "/api/v1/whoami")
    del headers[header]
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "missing_headers")


def test_no_headers_at_all(api: Signer) -> None:
    api.assert_401(api.send("GET", "/api/v1/whoami", {}), "missing_headers")
    api.assert_401(
        api.send("POST", "/api/v1/jobs", {"Content-Type": "application/json"}, job_body()), "missing_headers"
    )


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Authorization", "Bearer token"),
        ("Authorization", "KILN-HMAC-SHA256 Credential=AK, Signature=XYZ"),
        ("X-Kiln-Date", "yesterday"),
        ("X-Kiln-Date", "-5"),
        ("X-Kiln-Date", "1.7e9"),
        ("X-Kiln-Nonce", "short"),
        ("X-Kiln-Nonce", "has.dots.in.it.not.allowed"),
        ("X-Kiln-Nonce", "x" * 65),
    ],
)
def test_malformed_headers_are_refused(api: Signer, header: str, value: str) -> None:
    headers = api.headers("GET", "/api/v1/whoami")
    headers[header] = value
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "malformed")


def test_non_ascii_digit_date_is_refused_not_a_server_error(api: Signer) -> None:
    # Regression test (found by this suite, since fixed):
    # (src/kiln/usecases/access/identity.py, authenticate, lines 97/101): the date is checked with str.isdigit(), which
    # is
    # True for "²" (latin-1 byte 0xB2, a legal header byte); int("²") then raises ValueError and the unauthenticated
    # request gets 500 {"code": "internal"} instead of 401 malformed. Check with date.isascii() and date.isdigit()
    # (or a [0-9]+ regex).
    headers: dict[str, Any] = api.headers("GET", "/api/v1/whoami")
    headers["X-Kiln-Date"] = b"\xb2"
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "malformed")


def test_bad_body_hash_header_is_refused(api: Signer) -> None:
    headers = api.headers("GET", "/api/v1/whoami", content_sha256="not-a-hash")
    api.assert_401(api.send("GET", "/api/v1/whoami", headers), "malformed")


@pytest.mark.parametrize(("method", "path"), [("GET", "/api/v1/whoami"), ("POST", "/api/v1/jobs")])
def test_unsigned_payload_only_on_blob_uploads(api: Signer, method: str, path: str) -> None:
    body = job_body() if method == "POST" else b""
    headers = api.headers(method, path, content_sha256=signing.UNSIGNED_PAYLOAD)
    headers["Content-Type"] = "application/json"
    api.assert_401(api.send(method, path, headers, body), "malformed")


def test_unsigned_payload_is_refused_on_blob_head(api: Signer) -> None:
    path = f"/api/v1/blobs/{'b' * 64}"
    headers = api.headers("HEAD", path, content_sha256=signing.UNSIGNED_PAYLOAD)
    assert api.send("HEAD", path, headers).status_code == 401


def test_unauthenticated_invalid_json_is_refused_before_parsing(api: Signer) -> None:
    # Regression test (found by this suite, since fixed):
    # (src/kiln/api/routers/jobs.py + FastAPI body handling): FastAPI parses the JSON body before it runs the Caller
    # dependency, so an unsigned request with malformed JSON gets 422 invalid_input (with the odd field name "1")
    # instead of 401: unauthenticated clients can probe the API's input handling.
    response = api.send("POST", "/api/v1/jobs", {"Content-Type": "application/json"}, b"{not json")
    api.assert_401(response, "missing_headers")


# -- blob uploads -------------------------------------------------------------------------------------------------


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload(api: Signer, sha: str, data: Any, content_sha256: str = signing.UNSIGNED_PAYLOAD) -> httpx.Response:
    path = f"/api/v1/blobs/{sha}"
    headers = api.headers("PUT", path, content_sha256=content_sha256)
    headers["Content-Type"] = "application/gzip"
    return api.send("PUT", path, headers, data)


def head(api: Signer, sha: str) -> httpx.Response:
    path = f"/api/v1/blobs/{sha}"
    return api.send("HEAD", path, api.headers("HEAD", path))


def stored_blobs(server: KilnServer) -> list[str]:
    return sorted(p.name for p in (server.home / "store").rglob("*.tar.gz"))


def leftover_uploads(server: KilnServer) -> list[Path]:
    return [p for p in (server.home / "tmp").glob("blob-*")]


def test_blob_upload_with_unsigned_payload(api: Signer) -> None:
    data = tar_gz({"train.py": b"print('unsigned payload')\n"})
    sha = hashlib.sha256(data).hexdigest()
    assert head(api, sha).status_code == 404
    response = upload(api, sha, data)
    assert response.status_code == 201, response.text
    assert response.json() == {"sha256": sha, "size": len(data)}
    found = head(api, sha)
    assert found.status_code == 200
    assert found.headers["X-Kiln-Blob-Size"] == str(len(data))
    assert f"{sha}.tar.gz" in stored_blobs(api.server)
    assert upload(api, sha, data).status_code == 201  # uploading again is harmless


def test_blob_upload_signed_with_its_own_hash(api: Signer) -> None:
    data = tar_gz({"train.py": b"print('signed payload')\n"})
    sha = hashlib.sha256(data).hexdigest()
    assert upload(api, sha, data, content_sha256=sha).status_code == 201


def test_blob_upload_streamed_without_length(api: Signer) -> None:
    data = tar_gz({"train.py": b"print('streamed')\n" * 100})
    sha = hashlib.sha256(data).hexdigest()
    response = upload(api, sha, iter([data[:100], data[100:]]))
    assert response.status_code == 201, response.text
    assert head(api, sha).status_code == 200


def test_blob_content_header_with_another_hash_is_refused(api: Signer) -> None:
    data = tar_gz({"a.py": b"other hash"})
    sha = hashlib.sha256(data).hexdigest()
    response = upload(api, sha, data, content_sha256="c" * 64)
    assert response.status_code == 400
    assert response.json()["code"] == "digest_mismatch"
    assert head(api, sha).status_code == 404


def test_blob_with_wrong_bytes_is_refused_and_not_stored(api: Signer) -> None:
    claimed = tar_gz({"a.py": b"what the URL names"})
    sha = hashlib.sha256(claimed).hexdigest()
    response = upload(api, sha, tar_gz({"a.py": b"something else"}))
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "digest_mismatch"
    assert sha in response.json()["message"]
    missing = head(api, sha)
    assert missing.status_code == 404
    assert f"{sha}.tar.gz" not in stored_blobs(api.server)
    assert leftover_uploads(api.server) == []


def test_hostile_archive_is_refused_and_not_stored(api: Signer) -> None:
    data = tar_gz({"ok.py": b"1", "../evil": b"pwned"})
    sha = hashlib.sha256(data).hexdigest()
    response = upload(api, sha, data)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_archive"
    assert "../evil" in body["message"]
    assert head(api, sha).status_code == 404
    assert f"{sha}.tar.gz" not in stored_blobs(api.server)
    assert not (api.server.home / "evil").exists()
    assert leftover_uploads(api.server) == []


def test_not_an_archive_is_refused(api: Signer) -> None:
    data = b"just some bytes, not gzip"
    sha = hashlib.sha256(data).hexdigest()
    response = upload(api, sha, data)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_archive"
    assert head(api, sha).status_code == 404


def test_blob_url_must_be_a_lowercase_sha256(api: Signer) -> None:
    data = tar_gz({"a.py": b"x"})
    response = upload(api, hashlib.sha256(data).hexdigest().upper(), data)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_input"


def test_blob_upload_needs_a_valid_signature(api: Signer) -> None:
    data = tar_gz({"a.py": b"unauthenticated"})
    sha = hashlib.sha256(data).hexdigest()
    path = f"/api/v1/blobs/{sha}"
    headers = api.headers("PUT", path, content_sha256=signing.UNSIGNED_PAYLOAD, secret_key="wrong")
    api.assert_401(api.send("PUT", path, headers, data), "signature")
    assert head(api, sha).status_code == 404


def test_blob_bigger_than_the_limit_is_refused(make_server: Any) -> None:
    server = make_server(max_blob_bytes="1000")
    small_api = Signer(server)
    try:
        small = tar_gz({"a.py": b"fits"})
        assert len(small) < 1000
        assert upload(small_api, hashlib.sha256(small).hexdigest(), small).status_code == 201

        big = bytes(range(256)) * 8  # 2048 bytes
        sha = hashlib.sha256(big).hexdigest()
        declared = upload(small_api, sha, big)
        assert declared.status_code == 413, declared.text
        assert declared.json()["code"] == "payload_too_large"

        streamed = upload(small_api, sha, iter([big[:600], big[600:]]))  # chunked: no Content-Length
        assert streamed.status_code == 413, streamed.text
        assert streamed.json()["code"] == "payload_too_large"

        assert head(small_api, sha).status_code == 404
        assert leftover_uploads(server) == []
    finally:
        small_api.http.close()


# -- errors on the signed API -------------------------------------------------------------------------------------


def test_invalid_job_spec_names_the_field(api: Signer) -> None:
    body = {"spec": {"command": "echo hi", "runtime": {"python": sys.executable}, "resources": {"gpu": 1}}}
    response = api.post_json("/api/v1/jobs", body)
    assert response.status_code == 422, response.text
    data = response.json()
    assert data["code"] == "invalid_input"
    assert "spec.resources.gpu" in data["message"]
    assert {"field": "spec.resources.gpu", "message": "unknown field"} in data["details"]


def test_invalid_job_spec_value_names_the_field(api: Signer) -> None:
    response = api.post_json("/api/v1/jobs", {"spec": {"command": "echo", "env": {"KILN_JOB_ID": "x"}}})
    assert response.status_code == 422
    data = response.json()
    assert data["code"] == "invalid_input"
    assert [d["field"] for d in data["details"]] == ["spec.env"]
    assert "KILN_" in data["message"]


def test_unknown_job_is_not_found(api: Signer) -> None:
    response = api.call("GET", "/api/v1/jobs/job-0000000000000000")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "job job-0000000000000000 not found"}
    assert api.call("POST", "/api/v1/jobs/job-0000000000000000/cancel").json()["code"] == "not_found"
