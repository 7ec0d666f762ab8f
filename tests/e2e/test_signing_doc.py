"""docs/signing.md stays true: its bash client works against a live server and its worked example matches
kiln.auth.signing."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kiln.auth import signing
from kiln.settings import Settings
from tests.kilnserver import REPO, KilnServer

DOC = REPO / "docs" / "signing.md"
FENCE = re.compile(r"^```(?P<lang>[\w-]*)(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)

needs_tools = pytest.mark.needs("shell-tools")


def blocks() -> dict[str, str]:
    """Fenced blocks of the doc that carry title="...", by title (body without the closing fence's newline)."""
    out: dict[str, str] = {}
    for match in FENCE.finditer(DOC.read_text()):
        title = re.search(r'title="([^"]+)"', match.group("info"))
        if title:
            assert title.group(1) not in out, f"duplicate block {title.group(1)}"
            out[title.group(1)] = match.group("body")
    return out


def block(title: str) -> str:
    found = blocks()
    assert title in found, f"docs/signing.md has no block titled {title!r} (has {sorted(found)})"
    return found[title]


# -- the bash client ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("doc") / "kiln-curl.sh"
    path.write_text(block("kiln-curl.sh"))
    assert "curl" in path.read_text() and "openssl" in path.read_text()
    return path


def run_script(
    script: Path, server: KilnServer, *args: str, secret: str | None = None
) -> subprocess.CompletedProcess[str]:
    creds = server.credentials()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(
        KILN_ENDPOINT=server.url,
        KILN_ACCESS_KEY=creds["KILN_ACCESS_KEY"],
        KILN_SECRET_KEY=secret or creds["KILN_SECRET_KEY"],
        LANG="C.UTF-8",
    )
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=30)


def status_of(result: subprocess.CompletedProcess[str]) -> int:
    found = re.findall(r"^HTTP (\d{3})$", result.stderr, re.MULTILINE)
    assert found, result.stderr
    return int(found[-1])


@needs_tools
def test_script_whoami(script: Path, shared_server: KilnServer) -> None:
    result = run_script(script, shared_server, "GET", "/api/v1/whoami")
    assert (result.returncode, status_of(result)) == (0, 200), result.stderr
    body = json.loads(result.stdout)
    assert body["access_key"] == shared_server.credentials()["KILN_ACCESS_KEY"]
    assert body["user_name"] == "admin"


@needs_tools
def test_script_submits_a_job(script: Path, shared_server: KilnServer, tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(
        json.dumps({"spec": {"name": "doc-e2e", "command": "echo hi", "runtime": {"python": sys.executable}}})
    )
    result = run_script(script, shared_server, "-d", str(spec), "POST", "/api/v1/jobs")
    assert (result.returncode, status_of(result)) == (0, 201), result.stderr + result.stdout
    job = json.loads(result.stdout)
    assert job["id"].startswith("job-")
    assert job["name"] == "doc-e2e"
    assert job["spec"]["command"] == "echo hi"
    assert job["spec"]["runtime"]["python"] == sys.executable

    fetched = run_script(script, shared_server, "GET", f"/api/v1/jobs/{job['id']}")
    assert (fetched.returncode, status_of(fetched)) == (0, 200)
    assert json.loads(fetched.stdout)["id"] == job["id"]


@needs_tools
def test_script_encodes_and_sorts_a_hard_query(script: Path, shared_server: KilnServer) -> None:
    # Repeated names, names that are prefixes of others, spaces, '~', '/', '+', '&', '=', '%' and UTF-8: the
    # signature only matches when the script's canonical query equals kiln.auth.signing's.
    params = ["limit=500", "state=SUCCEEDED", "state=QUEUED", "a=1", "a-b=2", "a.c=3", "x y=é~/+&=%", "flag"]
    result = run_script(script, shared_server, "GET", "/api/v1/jobs", *params)
    assert (result.returncode, status_of(result)) == (0, 200), result.stderr + result.stdout
    assert isinstance(json.loads(result.stdout)["items"], list)


@needs_tools
def test_script_uploads_a_blob_and_heads_it(script: Path, shared_server: KilnServer, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        data = b"print('from kiln-curl.sh')\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(buffer.getvalue())
    sha = hashlib.sha256(buffer.getvalue()).hexdigest()
    put = run_script(script, shared_server, "-d", str(bundle), "-T", "application/gzip", "PUT", f"/api/v1/blobs/{sha}")
    assert (put.returncode, status_of(put)) == (0, 201), put.stderr + put.stdout
    assert json.loads(put.stdout) == {"sha256": sha, "size": bundle.stat().st_size}
    found = run_script(script, shared_server, "HEAD", f"/api/v1/blobs/{sha}")
    assert (found.returncode, status_of(found)) == (0, 200), found.stderr


@needs_tools
def test_script_reports_a_refusal(script: Path, shared_server: KilnServer) -> None:
    result = run_script(script, shared_server, "GET", "/api/v1/whoami", secret="not-the-secret")
    assert result.returncode == 22
    assert status_of(result) == 401
    body = json.loads(result.stdout)
    key = shared_server.credentials()["KILN_ACCESS_KEY"]
    assert body == {
        "code": "unauthenticated",
        "message": f"the signature does not match: the secret key does not match access key {key}",
        "details": {"reason": "signature"},
    }


@needs_tools
def test_script_refuses_a_query_in_the_path(script: Path, shared_server: KilnServer) -> None:
    result = run_script(script, shared_server, "GET", "/api/v1/jobs?limit=5")
    assert result.returncode == 2
    assert "NAME=VALUE" in result.stderr


# -- the worked example -------------------------------------------------------------------------------------------


def credentials() -> dict[str, str]:
    pairs = dict(line.split("=", 1) for line in block("example-credentials").splitlines() if line.strip())
    assert set(pairs) == {"KILN_ACCESS_KEY", "KILN_SECRET_KEY"}
    return pairs


def parse_request(text: str) -> tuple[str, str, str, dict[str, str], bytes]:
    head, _, body = text.partition("\n\n")
    request_line, *header_lines = head.splitlines()
    method, target, version = request_line.split(" ")
    assert version == "HTTP/1.1"
    path, _, query = target.partition("?")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return method, path, query, headers, body.rstrip("\n").encode()


@pytest.mark.parametrize("name", ["get", "post"])
def test_worked_example_matches_the_implementation(name: str) -> None:
    creds = credentials()
    method, path, query, headers, body_in_request = parse_request(block(f"{name}-request"))
    body = block("post-body.json").rstrip("\n").encode() if name == "post" else b""
    assert body_in_request == body
    if body:
        assert headers["Content-Length"] == str(len(body))
        assert json.loads(body)["spec"]["command"] == "echo hi"
    assert query == signing.canonical_query_from_raw(query), "the example sends a non-canonical query"

    expected = signing.sign_headers(
        access_key=creds["KILN_ACCESS_KEY"],
        secret_key=creds["KILN_SECRET_KEY"],
        method=method,
        path=path,
        query=query,
        content_sha256=signing.body_sha256(body),
        date=int(headers["X-Kiln-Date"]),
        nonce=headers["X-Kiln-Nonce"],
    )
    assert {k: headers[k] for k in expected} == expected

    text = signing.string_to_sign(
        method, path, query, headers["X-Kiln-Date"], headers["X-Kiln-Nonce"], signing.body_sha256(body)
    )
    assert block(f"{name}-string-to-sign") == text + "\n"
    sig = signing.signature(creds["KILN_SECRET_KEY"], text)
    assert block(f"{name}-signature").strip() == sig
    # An independent computation, so a bug shared by the doc and kiln.auth.signing would still show.
    assert sig == hmac.new(creds["KILN_SECRET_KEY"].encode(), text.encode(), hashlib.sha256).hexdigest()
    assert sig in DOC.read_text()


def test_worked_example_body_hash_in_the_prose() -> None:
    body = block("post-body.json").rstrip("\n").encode()
    doc = DOC.read_text()
    assert f"exactly these {len(body)} bytes" in doc
    assert f"Its SHA-256 is `{hashlib.sha256(body).hexdigest()}`" in doc


def test_worked_example_get_query_is_the_canonical_form_of_the_prose() -> None:
    doc = DOC.read_text()
    match = re.search(r"The client wants `([^`]+)`; the canonical\s+query is `([^`]+)`", doc)
    assert match, "the prose of the GET example changed; update this test"
    assert signing.canonical_query_from_raw(match.group(1)) == match.group(2)
    assert parse_request(block("get-request"))[2] == match.group(2)


@needs_tools
def test_openssl_snippet_reproduces_the_signature() -> None:
    snippet = block("verify-get-signature.sh")
    result = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == block("get-signature").strip()
    assert f"# SHA2-256(stdin)= {block('get-signature').strip()}" in snippet


def test_canonical_query_examples() -> None:
    lines = [line for line in block("canonical-query-examples").splitlines() if line.strip()]
    assert len(lines) >= 8
    for line in lines:
        raw, canonical = line.split(" => ")
        assert signing.canonical_query_from_raw(raw) == canonical, line


def test_doc_states_the_implemented_constants() -> None:
    doc = DOC.read_text()
    assert signing.ALGORITHM == "KILN-HMAC-SHA256"
    assert f"`{signing.UNSIGNED_PAYLOAD}`" in doc
    for header in (signing.HEADER_DATE, signing.HEADER_NONCE, signing.HEADER_CONTENT):
        assert f"`{header}`" in doc
    assert signing.NONCE_PATTERN.pattern == r"[A-Za-z0-9_-]{16,64}"
    assert "16 to 64 characters of `[A-Za-z0-9_-]`" in doc
    assert hashlib.sha256(b"").hexdigest() in doc
    for reason in ("missing_headers", "malformed", "stale", "replayed", "signature"):
        assert f"`{reason}`" in doc
    defaults = Settings.model_fields
    assert defaults["clock_skew_seconds"].default == 300 and "**300 seconds**" in doc
    assert defaults["nonce_ttl_seconds"].default == 900 and "**15 minutes**" in doc
