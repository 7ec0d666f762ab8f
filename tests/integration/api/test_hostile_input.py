"""What an attacker's test found, against a real server on each database (SQLite and PostgreSQL):

- A NUL character in a path parameter, a query parameter or a JSON string reached the database: PostgreSQL cannot
  store one in text, so on PostgreSQL it was a 500 with a traceback (``/api/v1/jobs/job-%00abc``,
  ``/api/v1/audit?user=%00``, ``POST /api/v1/keys`` with ``"a\\u0000b"``...). Every operation of the OpenAPI
  schema is walked with a NUL in each of its parameters and in each string of its JSON body: a 422 naming it.
- X-Forwarded-For was honoured from anyone on loopback (a job, say) to set the audit log's client address: now only
  from a peer in KILN_TRUSTED_PROXIES (the SQLite server, the shared one, trusts none, the default; the PostgreSQL
  one trusts loopback).
- A service token (``kst.``) could call ``/api/v1/whoami``: it may predict and nothing else, 403 elsewhere.
- Predict accepted 125,000 inputs where docs/serving.md says at most 100,000: a 422 naming ``inputs`` and the
  limit, before anything is forwarded (the service has no replica: nothing starts).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.components import require
from tests.conftest import _pg_connect, postgres_available
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api

PY = sys.executable
NUL = "a\x00b"
WRITES = "import os; open(os.path.join(os.environ['KILN_OUTPUT_DIR'], 'model.bin'), 'wb').write(b'm')"
SPOOFED = "203.0.113.7"
DOCUMENTED = 100_000  # docs/serving.md: `inputs` is a list of instances (at most 100,000)


@dataclass
class World:
    server: KilnServer
    admin: Api
    trusts_loopback: bool
    service: str
    token: str


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """SQLite: the shared server (default settings: no trusted proxy). PostgreSQL: one of the module's own, which
    trusts proxies on loopback."""
    pg_name = ""
    if request.param == "sqlite":
        server: KilnServer = request.getfixturevalue("shared_server")
    else:
        require("postgresql", postgres_available())
        pg_name = f"kiln_test_{secrets.token_hex(6)}"
        with _pg_connect() as conn:
            conn.execute(f'CREATE DATABASE "{pg_name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}"
        home = tmp_path_factory.mktemp("hostile") / "home"
        server = KilnServer(home, url, trusted_proxies="10.0.0.0/8, 127.0.0.1").start()
    log_start = server.log_path.stat().st_size
    admin = Api.admin(server)
    name = f"hostile-{secrets.token_hex(3)}"
    try:
        # A service with no replica (nothing starts) of a model a job wrote, and a token for it.
        job = admin.submit([PY, "-c", WRITES])
        admin.wait(job["id"], "SUCCEEDED", timeout=60)
        admin.ok("POST", f"/models/{name}/versions", json_body={"job_id": job["id"], "path": "model.bin"})
        spec = {"name": name, "model": f"{name}@1", "predictor": {"type": "sklearn"}, "replicas": 0}
        admin.ok("POST", "/services", json_body={"spec": {**spec, "runtime": {"python": PY}}})
        token = admin.ok("POST", f"/services/{name}/tokens")["token"]
        yield World(server, admin, bool(pg_name), name, token)
        # No request failed on the server, and every refused one is in the audit trail.
        with open(server.log_path, "rb") as log:
            log.seek(log_start)
            text = log.read().decode(errors="replace")
        for sign in ("unhandled error", "could not write audit record"):
            assert sign not in text, text[text.index(sign) : text.index(sign) + 3000]
    finally:
        admin.close()
        if pg_name:
            server.stop()
            with _pg_connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


# -- NUL characters, on every route --------------------------------------------------------------------------------


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def fill(schema: dict[str, Any], template: str, op: dict[str, Any], values: dict[str, str] | None = None) -> str:
    """``template`` with each path parameter set to ``values``' or a plain value of its type (nothing of that
    name exists)."""
    path = template
    for param in op.get("parameters", []):
        if param["in"] == "path":
            kind = resolve(schema, param.get("schema", {}))
            plain = "1" if kind.get("type") == "integer" else "0" * 64 if "pattern" in kind else "x"
            path = path.replace("{" + param["name"] + "}", (values or {}).get(param["name"], plain))
    return path


def example(schema: dict[str, Any], node: dict[str, Any], depth: int = 0) -> Any:
    """A value of the JSON schema ``node``, every optional property included (so that each string of it can be
    given a NUL in turn)."""
    node = resolve(schema, node)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            options = [o for o in node[key] if resolve(schema, o).get("type") != "null"]
            return example(schema, options[0], depth) if options else None
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return node["enum"][0]
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        if depth > 6:
            return {}
        value = {name: example(schema, prop, depth + 1) for name, prop in node.get("properties", {}).items()}
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and not value:
            value = {"k": example(schema, extra, depth + 1)}
        return value
    if kind == "array":
        return [example(schema, node.get("items", {}), depth + 1)] if depth <= 6 else []
    return {"integer": 1, "number": 1, "boolean": True, "null": None}.get(kind or "", "x")


def string_leaves(value: Any, location: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if isinstance(value, str):
        yield location
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from string_leaves(item, (*location, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from string_leaves(item, (*location, i))


def with_nul(value: Any, location: tuple[str | int, ...]) -> Any:
    if not location:
        return NUL
    head, *rest = location
    if isinstance(value, dict):
        return {k: with_nul(v, tuple(rest)) if k == head else v for k, v in value.items()}
    return [with_nul(v, tuple(rest)) if i == head else v for i, v in enumerate(value)]


@dataclass
class Case:
    method: str
    path: str
    params: list[tuple[str, str]]
    body: Any
    content: bytes | None
    content_type: str | None
    field: str | None  # the field the 422 must name (None: any 4xx, e.g. a predict body or an integer segment)


def nul_cases(schema: dict[str, Any]) -> Iterator[Case]:
    """For each operation: a NUL in each path parameter, in each query parameter, and in each string of its JSON
    body (a NUL byte in a body of another kind)."""
    for template, operations in schema["paths"].items():
        for method, op in operations.items():
            method = method.upper()
            plain = fill(schema, template, op)
            for param in op.get("parameters", []):
                name = param["name"]
                if param["in"] == "path":
                    integer = resolve(schema, param.get("schema", {})).get("type") == "integer"
                    nul_path = fill(schema, template, op, {name: "a%00b"})
                    yield Case(method, nul_path, [], None, None, None, None if integer else f"path.{name}")
                elif param["in"] == "query":
                    yield Case(method, plain, [(name, NUL)], None, None, None, f"query.{name}")
            for media_type, body in (op.get("requestBody") or {}).get("content", {}).items():
                if media_type != "application/json":  # read by the route itself: any 4xx
                    data = b'{"name": "a\\u0000b", "value": 1, "step": 1}\n' + b"a\x00b\n"
                    yield Case(method, plain, [], None, data, media_type, None)
                    continue
                value = example(schema, body.get("schema", {}))
                predict = template.endswith("/predict")  # the model's input, not Kiln's: a 404 for no service
                for leaf in string_leaves(value):
                    field = None if predict else ".".join(str(part) for part in leaf) or "body"
                    yield Case(method, plain, [], with_nul(value, leaf), None, None, field)


def test_a_nul_anywhere_is_a_422_naming_where(world: World) -> None:
    schema = world.admin.http.get("/api/v1/openapi.json").json()
    cases = list(nul_cases(schema))
    assert len(cases) > 200, len(cases)  # every operation's parameters and body strings
    problems: list[str] = []
    for case in cases:
        response = world.admin.request(
            case.method,
            case.path,
            params=case.params,
            json_body=case.body,
            content=case.content,
            content_type=case.content_type,
        )
        what = f"{case.method} {case.path} {case.params or ''} {case.field or case.content_type or ''}"
        if not 400 <= response.status_code < 500:
            problems.append(f"{what}: {response.status_code} {response.text[:200]}")
            continue
        if case.method == "HEAD":
            continue
        error = response.json()
        if not (error.get("code") and error.get("message")):
            problems.append(f"{what}: {response.status_code} without a code and a message: {response.text[:200]}")
        elif case.field is not None:
            named = [d.get("field") for d in error.get("details") or [] if isinstance(d, dict)]
            if response.status_code != 422 or case.field not in named:
                problems.append(f"{what}: {response.status_code} {response.text[:300]}")
    assert not problems, f"{len(problems)} of {len(cases)}:\n" + "\n".join(problems[:40])


def local_port(response: Any) -> int:
    """The client's port of the connection that carried ``response``."""
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


def test_the_requests_of_the_report(world: World) -> None:
    """As the attacker sent them: a 422 naming the parameter or field, on the connection kept alive."""
    port = local_port(world.admin.get("/whoami"))
    for path, field in (
        ("/api/v1/jobs/job-%00abc", "path.job_id"),
        ("/api/v1/jobs?before=%00", "query.before"),
        ("/api/v1/services/a%00b", "path.service"),
        ("/api/v1/studies/study-%00", "path.study_id"),
        ("/api/v1/users/a%00b", "path.user"),
        ("/api/v1/orgs/a%00b", "path.org"),
        ("/api/v1/audit?user=%00", "query.user"),
        ("/api/v1/audit?action=%00", "query.action"),
    ):
        target, _, query = path.partition("?")
        params = [tuple(query.replace("%00", "\x00").split("=", 1))] if query else None
        response = world.admin.get(target, params=params)
        assert response.status_code == 422, (path, response.text)
        assert local_port(response) == port, "the server closed the connection"
        assert response.json()["details"][0]["field"] == field, response.text
        assert "NUL" in response.json()["message"], response.text
    response = world.admin.post("/keys", {"user": NUL, "description": "x"})
    assert response.status_code == 422 and response.json()["details"][0]["field"] == "user", response.text
    # Unsigned, the same path is a 401 as always, and audited: its path is written with the NUL spelled out.
    anonymous = Api(world.server.url)
    assert anonymous.post("/jobs/job-%00abc/cancel").status_code == 401
    anonymous.close()
    records = world.admin.audit_until(lambda rs: any("\\u0000" in r["resource"] for r in rs), outcome="unauthenticated")
    assert any(r["resource"] == "/api/v1/jobs/job-\\u0000abc/cancel" for r in records), records[:3]


# -- X-Forwarded-For -----------------------------------------------------------------------------------------------


def test_x_forwarded_for_is_the_client_only_from_a_trusted_proxy(world: World) -> None:
    job_id = f"job-xff{secrets.token_hex(4)}"
    request = world.admin.build("POST", f"/jobs/{job_id}/cancel")
    request.headers["X-Forwarded-For"] = f"198.51.100.9, {SPOOFED}"
    assert world.admin.http.send(request).status_code == 404
    resource = f"job_id={job_id}"
    records = world.admin.audit_until(lambda rs: any(r["resource"] == resource for r in rs), action="cancel_job")
    (record,) = [r for r in records if r["resource"] == resource]
    # Trusted, the proxy's list is read from its end: the last address the proxy did not add itself.
    assert record["client"] == (SPOOFED if world.trusts_loopback else "127.0.0.1"), record


# -- service tokens ------------------------------------------------------------------------------------------------


def test_a_service_token_reaches_predict_and_no_other_route(world: World) -> None:
    schema = world.admin.http.get("/api/v1/openapi.json").json()
    token = Api(world.server.url, token=world.token)
    reached: list[str] = []
    try:
        whoami = token.get("/whoami")
        assert whoami.status_code == 403, whoami.text
        assert whoami.json()["code"] == "forbidden" and "may only predict" in whoami.json()["message"], whoami.text
        for template, operations in schema["paths"].items():
            if not template.startswith("/api/v1/") or template == "/api/v1/session" or template.endswith("/predict"):
                continue  # outside the API, signing in and out (no credentials needed), or the token's own route
            for method, op in operations.items():
                path = fill(schema, template, op, {"service": world.service, "framework": "python"})
                body = {} if method in ("post", "put", "patch") else None
                response = token.request(method.upper(), path, json_body=body)
                if response.status_code != 403 or (method != "head" and response.json()["code"] != "forbidden"):
                    reached.append(f"{method.upper()} {path}: {response.status_code} {response.text[:120]}")
        assert not reached, "\n".join(reached)
        # A mutating attempt is audited as denied, with the token's key.
        assert token.request("DELETE", f"/services/{world.service}").status_code == 403
        denied = world.admin.audit_until(bool, action=f"DELETE /api/v1/services/{world.service}", outcome="denied")
        assert denied and denied[0]["key_id"].startswith("service:") and denied[0]["detail"] == "service token"
        # Its predict is reached: refused for its size (below), not for the token.
        over = token.post(f"/services/{world.service}/predict", {"inputs": [0] * (DOCUMENTED + 1)})
        assert over.status_code == 422, over.text
        assert world.admin.ok("GET", f"/services/{world.service}")["name"] == world.service  # still there
    finally:
        token.close()


# -- predict's limit -----------------------------------------------------------------------------------------------


def test_predict_refuses_more_inputs_than_documented_before_forwarding(world: World) -> None:
    for count in (125_000, DOCUMENTED + 1):
        response = world.admin.post(f"/services/{world.service}/predict", {"inputs": [[0.5, 1]] * count})
        assert response.status_code == 422, response.text
        error = response.json()
        assert error["code"] == "invalid_input"
        assert error["details"] == {"field": "inputs", "max": DOCUMENTED, "count": count}, error
        assert error["message"].startswith("inputs: at most 100000 instances"), error
    # Nothing was forwarded: the service has no replica and was not asked for one.
    service = world.admin.ok("GET", f"/services/{world.service}")
    assert (service["desired_replicas"], service["replicas"]) == (0, []), service
