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
    # A streaming upload is not read here: the blob route hashes every byte and compares it with the URL
    # (and with X-Kiln-Content-SHA256, which must then be UNSIGNED-PAYLOAD or that same hash).
    body_hash = None if allow_unsigned_payload else signing.body_sha256(await request.body())
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
