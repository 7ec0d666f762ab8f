"""The API docs page on a real server: everything it loads comes from the server (no CDN), its security headers
let its own scripts run, and its signing script (run in Node, as the page's <script> defines it) signs requests
the server accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from swagger_ui_bundle import swagger_ui_path

from kiln.auth import signing
from tests.components import require
from tests.kilnserver import KilnServer

EXTERNAL_URL = re.compile(r"https?://", re.IGNORECASE)
OWN_ASSETS = ("kiln-signing.js", "kiln-docs.js", "kiln-docs.css")


class _References(HTMLParser):
    """Every src/href of a page, and the text of each <script> element."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self._in_script = False
        self.inline_script = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]
        if tag == "script":
            self.scripts.append(dict(attrs))
            self._in_script = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.inline_script += data.strip()


def _csp(header: str) -> dict[str, list[str]]:
    directives = (part.split() for part in header.split(";") if part.strip())
    return {words[0]: words[1:] for words in directives}


@pytest.fixture(scope="module")
def page(shared_server: KilnServer) -> tuple[httpx.Response, _References]:
    response = httpx.get(shared_server.url + "/api/v1/docs", timeout=30)
    refs = _References()
    refs.feed(response.text)
    return response, refs


def test_the_docs_page_and_everything_it_loads_come_from_the_server(shared_server, page):
    response, refs = page
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert not EXTERNAL_URL.search(response.text), "the page names an outside URL"
    assert refs.urls, "the page loads nothing"
    for url in refs.urls:
        assert url.startswith("/") and not url.startswith("//"), f"{url} is not on this server"
        asset = httpx.get(shared_server.url + url, timeout=30)
        assert asset.status_code == 200 and asset.content, url
        if url.rsplit("/", 1)[-1] in OWN_ASSETS:
            assert not EXTERNAL_URL.search(asset.text), f"{url} names an outside URL"
        if url.endswith(".css"):
            assert not re.search(r"url\(\s*['\"]?(https?:)?//", asset.text), f"{url} loads from outside"
        for source_map in re.findall(
            r"sourceMappingURL=(\S+?\.map)", asset.text if url.endswith((".js", ".css")) else ""
        ):
            mapped = httpx.get(shared_server.url + url.rsplit("/", 1)[0] + "/" + source_map, timeout=30)
            assert mapped.status_code == 200, f"{url} names a source map the server does not have: {source_map}"
    scripts = [s["src"] for s in refs.scripts]
    assert scripts == ["/docs/assets/swagger-ui-bundle.js", "/docs/assets/kiln-signing.js", "/docs/assets/kiln-docs.js"]
    init = httpx.get(shared_server.url + "/docs/assets/kiln-docs.js", timeout=30).text
    assert "requestInterceptor: requestInterceptor" in init and "url: OPENAPI_URL" in init
    assert "validatorUrl: null" in init  # Swagger UI would otherwise send the description to validator.swagger.io


def test_the_security_headers_let_the_page_run_its_own_scripts_only(page):
    response, refs = page
    assert len(response.headers.get_list("content-security-policy")) == 1
    csp = _csp(response.headers["content-security-policy"])
    # Every script is a file from this server ('self'); there is no inline script for the policy to refuse.
    assert csp["script-src"] == ["'self'"]
    assert refs.scripts and all(s.get("src") for s in refs.scripts) and refs.inline_script == ""
    assert "'self'" in csp["style-src"] and "'self'" in csp["img-src"]
    # The typed-in secret signs requests to this server only: no request may go anywhere else.
    assert csp["connect-src"] == ["'self'"] and csp["default-src"] == ["'none'"] and csp["form-action"] == ["'none'"]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_the_openapi_document_is_at_both_paths_and_swagger_ui_can_render_it(shared_server):
    api = httpx.get(shared_server.url + "/api/v1/openapi.json", timeout=30)
    root = httpx.get(shared_server.url + "/openapi.json", timeout=30)
    assert api.status_code == root.status_code == 200
    assert root.json() == api.json()
    assert api.json()["openapi"].startswith("3.1")
    # Swagger UI renders OpenAPI 3.1 from its version 5 on (4.x refuses the document).
    assert int(Path(str(swagger_ui_path)).name.split("-")[-1].split(".")[0]) >= 5
    docs = httpx.get(shared_server.url + "/docs", timeout=30)
    assert docs.status_code == 307 and docs.headers["location"] == "/api/v1/docs"


NODE_CLIENT = r"""
// Loads the signing script as the docs page does (from the server), then sends Swagger UI-shaped requests
// through its interceptor with Node's fetch, and prints what the server answered.
const vm = require("vm");
const [base, accessKey, secretKey, dryRun] = process.argv.slice(2);
const credentials = { accessKey, secretKey };
const json = JSON.stringify({ spec: { command: "echo 'é ✓ 😀'", runtime: { python: "/usr/bin/python3" } } });
const cases = [
  { name: "get", method: "GET", url: "/api/v1/whoami" },
  { name: "query", method: "GET", url: "/api/v1/jobs?state=RUNNING&limit=5&state=QUEUED&note=a b+c~d/é*&flag" },
  { name: "escaped-path", method: "GET", url: "/api/v1/jobs/job%20x" },
  { name: "post", method: "POST", url: dryRun, body: json },
  { name: "blob-body", method: "POST", url: base + dryRun, body: new Blob([json]) },
  { name: "tampered", method: "POST", url: dryRun, body: json, tamper: true },
  { name: "public", method: "GET", url: "/api/v1/openapi.json" },
];
(async () => {
  vm.runInThisContext(await (await fetch(base + "/docs/assets/kiln-signing.js")).text());
  const results = [];
  for (const c of cases) {
    const request = { url: c.url, method: c.method, body: c.body, headers: { "Content-Type": "application/json" } };
    await KilnSigning.interceptRequest(request, credentials, base);
    const body = c.tamper ? request.body.replace("echo", "ECHO") : request.body;
    const response = await fetch(new URL(request.url, base), { method: c.method, headers: request.headers, body });
    results.push({ name: c.name, signed: "Authorization" in request.headers, status: response.status,
                   body: (await response.text()).slice(0, 500) });
  }
  const fixed = await KilnSigning.signRequest(
    { method: "get", url: "http://kiln.example.com:8080/api/v1/jobs?state=RUNNING&limit=20&state=QUEUED" },
    { accessKey: "AKEXAMPLE00000000001", secretKey: "kiln-example-secret_0123456789abcdefABCDEF" },
    { date: 1764460800, nonce: "example-nonce-0001-aaaa" });
  console.log(JSON.stringify({ results, fixed }));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def test_the_signing_script_signs_requests_the_server_accepts(shared_server, tmp_path):
    require("node")
    node = shutil.which("node")
    assert node
    script = tmp_path / "client.js"
    script.write_text(NODE_CLIENT)
    creds = shared_server.credentials()
    # The job dry run (a POST with a JSON body that creates nothing), wherever the document puts it.
    document = httpx.get(shared_server.url + "/api/v1/openapi.json", timeout=30).json()
    dry_run = next(
        path
        for path, operations in document["paths"].items()
        if operations.get("post", {}).get("operationId") == "dry_run_job"
    )
    run = subprocess.run(
        [node, str(script), shared_server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"], dry_run],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    answers = {r["name"]: r for r in out["results"]}
    assert answers["get"]["status"] == 200 and creds["KILN_ACCESS_KEY"] in answers["get"]["body"]
    assert answers["query"]["status"] == 200, answers["query"]
    escaped = answers["escaped-path"]
    assert escaped["status"] in (404, 422) and "unauthenticated" not in escaped["body"], escaped
    for name in ("post", "blob-body"):
        assert answers[name]["status"] == 200, answers[name]
        assert '"command":"echo \'é ✓ 😀\'"' in answers[name]["body"]
    # A body changed after signing is refused: the server did check what the script signed.
    assert answers["tampered"]["status"] == 401 and '"code":"unauthenticated"' in answers["tampered"]["body"]
    assert answers["public"] == {**answers["public"], "signed": False, "status": 200}
    assert all(r["signed"] for r in out["results"] if r["name"] != "public")
    # For a fixed input it writes what kiln.auth.signing writes (the worked example of docs/signing.md).
    expected = signing.sign_headers(
        access_key="AKEXAMPLE00000000001",
        secret_key="kiln-example-secret_0123456789abcdefABCDEF",
        method="GET",
        path="/api/v1/jobs",
        query=signing.canonical_query_from_raw("state=RUNNING&limit=20&state=QUEUED"),
        content_sha256=signing.body_sha256(b""),
        date=1764460800,
        nonce="example-nonce-0001-aaaa",
    )
    assert out["fixed"] == expected
    assert expected["Authorization"].endswith("4b199a0296f8ccd806144b36d856bf48c6d1e512aa1382c57bef44ddf17e8e2b")
