"""The web console's sign-in: ``/api/v1/session`` and the cookie the rest of ``/api/v1`` accepts (docs/console.md).

- ``POST /api/v1/session`` ``{"key_id", "secret"}`` (no signature): checks the pair as the server checks a signed
  request's key (unknown, wrong secret, disabled, expired: 401, audited like a failed signature; rate limited per
  access key), and answers the caller and a CSRF token with ``Set-Cookie: kiln_session=<token>; HttpOnly;
  SameSite=Strict; Path=/`` (and ``Secure`` over https).
- ``GET /api/v1/session``: the same answer for a request authenticated by that cookie, 401 for any other.
- ``DELETE /api/v1/session``: clears the cookie (it needs no valid session: signing out must always work).

The token and CSRF functions are ``kiln.auth.sessions``; kiln.api.auth authenticates the other routes' cookie
requests with ``authenticate`` below and checks their ``X-Kiln-CSRF``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import cookie_parser

from kiln.api.deps import caller_of, model_response, platform_of
from kiln.api.responses import errors
from kiln.auth import signing
from kiln.auth.secrets import load_or_create_server_key
from kiln.auth.sessions import COOKIE, CSRF_HEADER, SessionInvalid, SessionKeys
from kiln.domain.schemas import WhoAmI
from kiln.errors import RateLimited, Unauthenticated
from kiln.platform import Platform
from kiln.usecases.access.audit import AuditEntry
from kiln.usecases.access.identity import AuthFailure, Principal

log = logging.getLogger("kiln.auth")

SESSION_PATH = "/api/v1/session"
NO_SESSION = (
    "no console session: this request is not authenticated by the console's cookie (sign in with POST "
    "/api/v1/session; a signed request has no session)"
)

router = APIRouter(prefix="/session", tags=["console session"])


class SessionCreate(BaseModel):
    """An access key pair, as `kiln login` takes it."""

    model_config = ConfigDict(extra="forbid")

    key_id: str = Field(
        min_length=20, max_length=20, pattern=signing.ACCESS_KEY_PATTERN.pattern, description="Access key id (AK...)."
    )
    secret: str = Field(min_length=1, max_length=200, description="Its secret key.")


class SessionRead(BaseModel):
    """The signed-in caller and what the console sends with every change."""

    user: WhoAmI
    csrf_token: str = Field(description=f"Send it as the {CSRF_HEADER} header of every request that changes something.")
    expires_at: datetime = Field(description="When the session ends (it ends sooner if its key is disabled).")


@dataclass(frozen=True)
class ConsoleSession:
    """What kiln.api.auth leaves in the request's state for a cookie-authenticated request."""

    token: str
    expires_at: int


def session_keys(app: Starlette) -> SessionKeys:
    """The session keys of this server, derived from its server key (read once, as the platform read it)."""
    keys: SessionKeys | None = getattr(app.state, "session_keys", None)
    if keys is None:
        settings = app.state.platform.settings
        server_key = (
            settings.server_key.encode()
            if settings.server_key
            else load_or_create_server_key(settings.home / "server.key")
        )
        keys = app.state.session_keys = SessionKeys(server_key)
    return keys


def session_cookie(headers: dict[str, str]) -> str | None:
    """The ``kiln_session`` cookie of a request's headers (lower-case names), if it has one."""
    cookie = headers.get("cookie")
    if not cookie:
        return None
    return cookie_parser(cookie).get(COOKIE) or None


async def authenticate(app: Starlette, token: str) -> tuple[Principal, ConsoleSession]:
    """The caller of a request that carries a session cookie; AuthFailure when the token is not this server's,
    has expired, or its access key (or user) no longer may sign in."""
    try:
        key_id, expires_at = session_keys(app).verify(token, time.time())
    except SessionInvalid as exc:
        raise AuthFailure(exc.reason, f"session cookie: {exc.reason}", key_id=exc.key_id, message=exc.message) from None
    identity = app.state.platform.identity
    principal = identity.authenticate_key(key_id, blocking=False)
    if principal is None:
        principal = await run_in_threadpool(identity.authenticate_key, key_id)
    return principal, ConsoleSession(token, expires_at)


def _session_read(app: Starlette, principal: Principal, session: ConsoleSession) -> SessionRead:
    user = WhoAmI(
        user_id=principal.user_id,
        user_name=principal.user_name,
        org_id=principal.org_id,
        org_name=principal.org_name,
        access_key=principal.key_id,
        platform_admin=principal.platform_admin,
        role=principal.role,
    )
    csrf = session_keys(app).csrf(session.token)
    return SessionRead(user=user, csrf_token=csrf, expires_at=datetime.fromtimestamp(session.expires_at, UTC))


def _cookie(value: str, max_age: int, secure: bool) -> str:
    return f"{COOKIE}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def _client(request: Request) -> str:
    return request.client.host if request.client else "-"


async def _audit(platform: Platform, entry: AuditEntry) -> None:
    await run_in_threadpool(platform.audit.record, entry)


@router.post(
    "",
    response_model=SessionRead,
    summary="Sign in to the console",
    description="Checks an access key pair and sets the console's session cookie (HttpOnly, SameSite=Strict). "
    "Needs no signature: the pair is the credential.",
    responses=errors(400, 422),  # 400: a body that is not JSON
)
async def sign_in(body: SessionCreate, request: Request) -> Response:
    platform = platform_of(request)
    client = _client(request)
    wait = platform.rate_limiter.acquire(body.key_id)
    if wait > 0:
        error = RateLimited(f"too many requests for {body.key_id}; retry in {wait:.1f}s")
        retry = {"Retry-After": platform.rate_limiter.retry_after(wait)}
        return JSONResponse(error.to_body(), status_code=429, headers=retry)
    try:
        principal = await run_in_threadpool(platform.identity.authenticate_key, body.key_id, body.secret)
    except AuthFailure as exc:
        log.warning("401 console sign-in from %s: %s %s", client, exc.reason, exc.log_detail)
        entry = AuditEntry(
            action="POST /api/v1/session",
            resource="session",
            outcome="unauthenticated",
            status=401,
            client=client,
            org_id=exc.org_id,
            user_id=exc.user_id,
            key_id=exc.key_id,
            detail=exc.reason,
        )
        await _audit(platform, entry)
        return JSONResponse(exc.to_body(), status_code=401)
    assert principal is not None  # blocking: a principal or AuthFailure
    max_age = int(platform.settings.session_hours * 3600)
    expires_at = int(time.time()) + max_age
    session = ConsoleSession(session_keys(request.app).mint(principal.key_id, expires_at), expires_at)
    response = model_response(_session_read(request.app, principal, session))
    response.headers["Set-Cookie"] = _cookie(session.token, max_age, request.url.scheme == "https")
    response.headers["Cache-Control"] = "no-store"
    entry = AuditEntry(
        action="sign_in",
        resource="session",
        outcome="success",
        status=200,
        client=client,
        org_id=principal.org_id,
        user_id=principal.user_id,
        key_id=principal.key_id,
    )
    await _audit(platform, entry)
    return response


@router.get(
    "",
    response_model=SessionRead,
    summary="The console session of this browser",
    description="The signed-in caller and the CSRF token, for a request authenticated by the session cookie; 401 "
    "for any other (the console calls it when it loads).",
    responses=errors(403),  # 403: a service token (kiln.api.auth)
)
async def get_session(request: Request) -> Response:
    principal = caller_of(request)
    session = request.scope.get("state", {}).get("session")
    if not isinstance(session, ConsoleSession):
        raise Unauthenticated(NO_SESSION)
    response = model_response(_session_read(request.app, principal, session))
    response.headers["Cache-Control"] = "no-store"
    return response


@router.delete(
    "",
    status_code=204,
    summary="Sign out of the console",
    description="Clears the session cookie. A copy of the token kept elsewhere stays valid until it expires or "
    "its access key is disabled (docs/console.md).",
    responses=errors(),
)
async def sign_out(request: Request) -> Response:
    return Response(
        status_code=204,
        headers={"Set-Cookie": _cookie("", 0, request.url.scheme == "https"), "Cache-Control": "no-store"},
    )
