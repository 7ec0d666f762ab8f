"""Dependencies shared by routes: the platform and the authenticated caller."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from kiln.auth import signing
from kiln.platform import Platform
from kiln.services.identity import AuthFailure, Principal

log = logging.getLogger("kiln.auth")


def get_platform(request: Request) -> Platform:
    return request.app.state.platform  # type: ignore[no-any-return]


async def _authenticate(request: Request, *, allow_unsigned_payload: bool) -> Principal:
    platform: Platform = request.app.state.platform
    content = request.headers.get(signing.HEADER_CONTENT.lower())
    body_hash = None
    if not (allow_unsigned_payload and content == signing.UNSIGNED_PAYLOAD):
        if allow_unsigned_payload:
            # Streaming upload that signed a real hash: the blob route verifies it against the content.
            body_hash = None
        else:
            body_hash = signing.body_sha256(await request.body())
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    try:
        return await run_in_threadpool(
            platform.identity.authenticate,
            method=request.method,
            path=raw_path.decode("latin-1"),
            query=request.url.query,
            headers={k.lower(): v for k, v in request.headers.items()},
            body_sha256=body_hash,
            allow_unsigned_payload=allow_unsigned_payload,
        )
    except AuthFailure as exc:
        client = request.client.host if request.client else "-"
        log.warning("401 %s %s from %s: %s %s", request.method, request.url.path, client, exc.reason, exc.log_detail)
        raise


async def authenticated(request: Request) -> Principal:
    return await _authenticate(request, allow_unsigned_payload=False)


async def authenticated_upload(request: Request) -> Principal:
    return await _authenticate(request, allow_unsigned_payload=True)


Caller = Annotated[Principal, Depends(authenticated)]
Uploader = Annotated[Principal, Depends(authenticated_upload)]
Kiln = Annotated[Platform, Depends(get_platform)]
