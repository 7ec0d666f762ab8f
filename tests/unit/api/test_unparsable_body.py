"""A JSON body that cannot be parsed is the body's fault whatever the reason: 422 naming ``body``, as a syntax
error is (schemathesis sent bytes that are not UTF-8 and got FastAPI's undocumented 400)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.testclient import TestClient

from kiln.api.errors import install_error_handlers


class Body(BaseModel):
    text: str


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/model")
    def model(body: Body) -> dict[str, int]:
        return {"size": len(body.text)}

    return TestClient(app)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\xef\xbf\xbd\r\x06X\xff|", "not UTF-8 (byte 6)"),
        (b"[" * 100_000, "nested too deeply"),
    ],
    ids=["not-utf8", "too-deep"],
)
def test_an_unparsable_body_is_a_422_naming_the_body(client: TestClient, body: bytes, why: str) -> None:
    answer = client.post("/model", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json() == {
        "code": "invalid_input",
        "message": f"invalid request: body: {why}",
        "details": [{"field": "body", "message": why}],
    }


def test_a_syntax_error_is_still_the_validation_422(client: TestClient) -> None:
    answer = client.post("/model", content=b"{nope", headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_input"
    assert answer.json()["details"] == [
        {"field": "body", "message": "not JSON: Expecting property name enclosed in double quotes (character 1)"}
    ]
