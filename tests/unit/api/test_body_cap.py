"""A body that nothing signs (a job token's request) is capped as a signed one is: 413 once it passes the cap,
whether the route reads it itself or FastAPI reads it for a model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from kiln.api.auth import _capped
from kiln.api.errors import install_error_handlers
from kiln.api.routers.jobs import at_most
from kiln.errors import PayloadTooLarge

CAP = 1000


class Body(BaseModel):
    text: str


def app_with_cap() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    @app.post("/model")
    def model(body: Body) -> dict[str, int]:
        return {"size": len(body.text)}

    def cap(inner: ASGIApp) -> ASGIApp:
        async def capped(scope: Scope, receive: Receive, send: Send) -> None:
            await inner(scope, _capped(receive, CAP), send)

        return capped

    app.add_middleware(lambda inner: cap(inner))  # type: ignore[arg-type]
    return app


@pytest.mark.parametrize("route", ["/raw", "/model"])
def test_a_body_over_the_cap_is_a_413(route: str) -> None:
    with TestClient(app_with_cap()) as client:
        body = b'{"text": "' + b"x" * (2 * CAP) + b'"}'
        response = client.post(route, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 413, response.text
        assert response.json() == {"code": "payload_too_large", "message": f"request body over {CAP} bytes"}
        small = client.post(route, json={"text": "x" * 10})
        assert small.status_code == 200 and small.json()["size"] > 0


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def test_a_streamed_file_over_its_maximum_stops_with_a_413() -> None:
    assert asyncio.run(_collect(at_most(_chunks(b"ab", b"cd"), 4))) == b"abcd"
    with pytest.raises(PayloadTooLarge, match="at most 3 bytes"):
        asyncio.run(_collect(at_most(_chunks(b"ab", b"cd"), 3)))
