"""Authentication of every ``/api/v1`` request, before routing and body parsing.

A middleware rather than a per-route dependency, so that (1) no route can be added without it, and (2) an
unsigned or tampered request gets 401 before anything reads, parses or validates its body.
"""

from __future__ import annotations

import logging
import re

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln.auth import signing
from kiln.errors import PayloadTooLarge
from kiln.services.identity import AuthFailure

log = logging.getLogger("kiln.auth")

API_PREFIX = "/api/v1/"
PUBLIC_PATHS = {"/api/v1/openapi.json", "/api/v1/docs", "/api/v1/docs/oauth2-redirect"}
# The one route whose body is streamed and hashed by the route itself (it is content-addressed).
STREAMED_UPLOAD = re.compile(r"/api/v1/blobs/[^/]+")
MAX_SIGNED_BODY = 16 * 1024 * 1024


class SignatureMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(API_PREFIX) or path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        streamed = method == "PUT" and STREAMED_UPLOAD.fullmatch(path) is not None
        body_hash: str | None = None
        if not streamed:
            try:
                body = await _read_body(receive)
            except PayloadTooLarge as exc:
                await JSONResponse(exc.to_body(), status_code=exc.status)(scope, receive, send)
                return
            body_hash = signing.body_sha256(body)
            receive = _replay(body, receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        platform = scope["app"].state.platform
        try:
            principal = await run_in_threadpool(
                platform.identity.authenticate,
                method=method,
                path=(scope.get("raw_path") or path.encode()).decode("latin-1"),
                query=scope.get("query_string", b"").decode("latin-1"),
                headers=headers,
                body_sha256=body_hash,
                allow_unsigned_payload=streamed,
            )
        except AuthFailure as exc:
            client = scope.get("client") or ("-", 0)
            log.warning("401 %s %s from %s: %s %s", method, path, client[0], exc.reason, exc.log_detail)
            await JSONResponse(exc.to_body(), status_code=401)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_SIGNED_BODY:
            raise PayloadTooLarge(f"request body over {MAX_SIGNED_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
