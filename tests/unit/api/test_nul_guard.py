"""kiln.api.nul: a NUL in a path parameter, a query parameter or a JSON body's string is a 422 naming where it is,
before the route runs; everything else reaches the route as it was sent (tests/integration/api/test_hostile_input.py
walks every route of the real server on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import compile_path
from starlette.testclient import TestClient

from kiln.api.errors import install_error_handlers
from kiln.api.nul import NulGuard


class Thing(BaseModel):
    name: str
    tags: dict[str, str] = {}
    files: list[dict[str, str]] = []


def app() -> FastAPI:
    application = FastAPI()
    install_error_handlers(application)

    @application.get("/api/v1/things/{thing_id}")
    async def get_thing(thing_id: str, q: str | None = None) -> dict[str, Any]:
        return {"id": thing_id, "q": q}

    @application.post("/api/v1/things")
    async def create_thing(thing: Thing) -> dict[str, Any]:
        return thing.model_dump()

    @application.post("/api/v1/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    @application.post("/notebooks/{notebook}/api/contents")  # the proxy's: outside what kiln.api.auth caps
    async def outside(notebook: str, request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    @application.post("/api/v1/services/{service}/predict")
    async def predict(service: str, request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    application.add_middleware(NulGuard)
    routes = [r for r in application.routes if isinstance(r, APIRoute)]
    application.state.route_methods = [(compile_path(r.path)[0], frozenset(r.methods)) for r in routes]
    return application


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(app())


def refused(response: Any) -> list[str]:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "invalid_input" and "NUL" in body["message"], body
    return [d["field"] for d in body["details"]]


def test_a_nul_in_a_path_or_query_parameter_names_it(client: TestClient) -> None:
    assert refused(client.get("/api/v1/things/a%00b")) == ["path.thing_id"]
    assert refused(client.get("/api/v1/things/x?q=%00")) == ["query.q"]
    assert refused(client.get("/api/v1/things/x?a%00b=1")) == ["query.a\\u0000b"]
    # An escaped percent sign is not one.
    assert client.get("/api/v1/things/x?q=%2500").json() == {"id": "x", "q": "%00"}
    assert client.get("/nothing/a%00b").status_code == 404  # no route: the router's answer, which reads nothing


def test_a_nul_in_a_json_string_or_key_names_the_field(client: TestClient) -> None:
    assert refused(client.post("/api/v1/things", json={"name": "a\x00b"})) == ["name"]
    body = {"name": "x", "tags": {"k\x00": "v"}, "files": [{"path": "ok"}, {"path": "a\x00"}]}
    assert refused(client.post("/api/v1/things", json=body)) == ["tags.k\\u0000", "files.1.path"]
    # Without a content type FastAPI reads JSON too; with a JSON subtype as well.
    data = json.dumps({"name": "\x00"}).encode()
    assert refused(client.post("/api/v1/things", content=data)) == ["name"]
    merge = {"Content-Type": "application/merge+json"}
    assert refused(client.post("/api/v1/things", content=data, headers=merge)) == ["name"]
    # A backslash followed by u0000 is text, not a NUL.
    assert client.post("/api/v1/things", json={"name": "\\u0000"}).json()["name"] == "\\u0000"


def test_other_bodies_reach_the_route_whole(client: TestClient) -> None:
    data = b'{"name": "a\\u0000b"}\n\x00'
    plain = {"Content-Type": "text/plain"}
    assert client.post("/api/v1/raw", content=data, headers=plain).json() == {"size": len(data)}
    predict = json.dumps({"inputs": ["a\x00b"]}).encode()  # the model's input: forwarded, never stored
    assert client.post("/api/v1/services/s/predict", content=predict).json() == {"size": len(predict)}

    def chunks() -> Any:
        yield b'{"name": '
        yield b'"sent in parts"}'

    answer = client.post("/api/v1/things", content=chunks(), headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json()["name"] == "sent in parts", answer.text


def test_a_body_outside_the_api_is_never_buffered_here(client: TestClient) -> None:
    # kiln.api.auth caps /api/v1 and /mlflow bodies before this guard; a body elsewhere (the notebook proxy's, or
    # any path no route serves) read here was read whole, uncapped, before its caller was known.
    taken: list[int] = []

    def chunks() -> Any:
        for part in (b'{"name": ', b'"a\\u0000b"}'):
            taken.append(len(part))
            yield part

    answer = client.post("/notebooks/nb-x/api/contents", content=chunks(), headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == {"size": sum(taken)}, answer.text
