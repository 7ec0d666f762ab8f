"""Authentication, rate limiting and audit of every ``/api/v1`` request, before routing and body parsing.

A middleware rather than a per-route dependency, so that (1) no route can be added without it, (2) an unsigned
or tampered request gets 401 before anything reads, parses or validates its body, and (3) every mutating request
and every refused one lands in the audit trail whatever route it hit (a predict, which changes nothing, only
when refused).

A request is authenticated by its signature, a bearer token (a job's or a service's), or, with neither, the web
console's session cookie (kiln.api.session); under ``/mlflow/`` (MLflow's tracking protocol, kiln.api.mlflow) also
by HTTP basic authentication with an access key's id and secret, as MLflow's client sends
``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` — only over HTTPS or from this machine unless the operator allows plain
HTTP (``KILN_MLFLOW_BASIC_AUTH_OVER_HTTP``), since the secret itself crosses the wire. A request that carries both a
signature and the cookie is judged by its signature alone. A cookie-authenticated request that changes something
must carry the session's CSRF token (``X-Kiln-CSRF``), or it is refused with 403 ``csrf`` before any route runs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln.api import session
from kiln.api.errors import error_response
from kiln.auth import signing
from kiln.auth.ratelimit import RateLimiter
from kiln.auth.sessions import CSRF_HEADER
from kiln.domain import idempotency, limits
from kiln.errors import CsrfRefused, Forbidden, KilnError, PayloadTooLarge, RateLimited
from kiln.usecases.access.audit import AuditEntry
from kiln.usecases.access.identity import AuthFailure, Principal

log = logging.getLogger("kiln.auth")

API_PREFIX = "/api/v1/"
MLFLOW_PREFIX = "/mlflow/"  # MLflow's tracking protocol (kiln.api.mlflow)
# The console page at MLflow UI's address (kiln.api.console.MLFLOW_UI_PATHS) holds no data: the console signs in.
PUBLIC_PATHS = {"/api/v1/openapi.json", "/api/v1/docs", "/api/v1/docs/oauth2-redirect", "/mlflow/"}
# Routes whose body is streamed and hashed by the route itself (content-addressed or job-token uploads).
STREAMED_UPLOAD = re.compile(
    r"/api/v1/blobs/[^/]+|/api/v1/jobs/[^/]+/artifacts/.+|/api/v1/notebooks/[^/]+/home"
    r"|/mlflow/api/2\.0/mlflow-artifacts/artifacts/.+"
)
# The one route a service token (``Bearer kst.…``) reaches; any other answers 403 before a route runs.
SERVICE_TOKEN_ROUTE = ("POST", re.compile(r"/api/v1/services/[^/]+/predict"))
# POSTs that change nothing (a predict: a body in, an answer out) are audited only when refused, not once per answer.
# A record per predict was a write transaction per request at serving rates: the writes queued for SQLite's write
# lock on every worker thread, and a predict whose route or key cache had just expired waited behind them for its own
# lookup, hundreds of milliseconds (the tail of a predict at 16 clients, issue 26). The router counts the answers.
# MLflow's logging calls (a training loop's log_metric, each step) are audited only when refused, for the same reason.
MLFLOW_LOGGING = ("POST", re.compile(r"/mlflow/api/2\.0/mlflow/runs/(log-metric|log-parameter|log-batch|set-tag)"))
READ_BY_POST = (SERVICE_TOKEN_ROUTE, MLFLOW_LOGGING)
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|::1|localhost)$")
BASIC_OVER_HTTP = (
    "HTTP basic authentication sends the access key's secret itself: this server takes it over HTTPS or from this "
    "machine only (the operator allows plain HTTP with KILN_MLFLOW_BASIC_AUTH_OVER_HTTP); use https://, or a job's "
    "MLFLOW_TRACKING_TOKEN"
)
MAX_SIGNED_BODY = limits.MAX_SIGNED_BODY_BYTES
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
REPLAYED = idempotency.REPLAYED_HEADER.lower().encode()  # as the response's raw headers name it
# Signing in and out of the console needs no credential but the pair in the body (kiln.api.session checks,
# rate-limits and audits it); its body is still capped.
SESSION_OPEN = {("POST", session.SESSION_PATH), ("DELETE", session.SESSION_PATH)}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}  # what a cookie-authenticated request may do without the CSRF token
CSRF_MISSING = (
    "this request changes something and is authenticated by the console's session cookie: it needs the header "
    f"{CSRF_HEADER} with the session's csrf_token (from POST or GET /api/v1/session)"
)
CSRF_WRONG = f"the {CSRF_HEADER} header is not this session's csrf_token (GET /api/v1/session has it)"
SERVICE_TOKEN_ONLY = (
    "a service token may not do this: it may only predict on its service (POST /api/v1/services/NAME/predict)"
)


def _why_refused(body: bytes) -> str:
    """``code: message`` of an error body (kiln.errors' JSON), "" if it is none."""
    try:
        error = json.loads(body)
        return f"{error['code']}: {error['message']}"[:256] if isinstance(error, dict) else ""
    except (ValueError, KeyError, TypeError):
        return ""


class SignatureMiddleware:
    def __init__(self, app: ASGIApp, limiter: RateLimiter | None = None) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith((API_PREFIX, MLFLOW_PREFIX)) or path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if (method, path) in SESSION_OPEN:
            await self.app(scope, _capped(receive, MAX_SIGNED_BODY), send)
            return
        platform = scope["app"].state.platform
        client = (scope.get("client") or ("-", 0))[0]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            principal, receive, console = await self._authenticate(scope, receive, headers, platform)
        except AuthFailure as exc:
            await JSONResponse(exc.to_body(), status_code=401)(scope, receive, send)
            if method == "GET" and path == session.SESSION_PATH and not _offers_credentials(headers):
                # The console's "am I signed in?" on its sign-in page: a question, not a failed authentication.
                log.debug("401 %s %s from %s: no credentials", method, path, client)
                return
            await record_unauthenticated(platform, method, path, client, exc)
            return
        except KilnError as exc:  # 413 for a body too large; 503 (with Retry-After) for the database unavailable
            await error_response(exc)(scope, receive, send)
            return
        limiter = self.limiter or platform.rate_limiter
        wait = limiter.acquire(principal.key_id)
        if wait > 0:
            error = RateLimited(f"too many requests for {principal.key_id}; retry in {wait:.1f}s")
            response = JSONResponse(
                error.to_body(), status_code=429, headers={"Retry-After": limiter.retry_after(wait)}
            )
            await response(scope, receive, send)
            return
        if principal.service_id is not None and not _service_token_route(method, path):
            refused = Forbidden(SERVICE_TOKEN_ONLY)
            await self._refuse(scope, receive, send, principal, client, refused, "service token", "service token")
            return
        state = scope.setdefault("state", {})
        state["principal"] = principal
        if console is not None:
            state["session"] = console
            if method not in SAFE_METHODS:
                csrf = headers.get(CSRF_HEADER.lower())
                if not session.session_keys(scope["app"]).csrf_matches(console.token, csrf):
                    refusal = CsrfRefused(CSRF_MISSING if csrf is None else CSRF_WRONG)
                    why = f"{'no' if csrf is None else 'wrong'} csrf token"
                    await self._refuse(scope, receive, send, principal, client, refusal, why, "csrf")
                    return
        if method not in MUTATING:
            await self.app(scope, receive, send)
            return
        status = 500
        created_id = ""
        replayed = False
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal status, replayed
            if message["type"] == "http.response.start":
                status = int(message["status"])
                replayed = (REPLAYED, b"true") in message.get("headers", [])
            elif message["type"] == "http.response.body" and status in (201, 403) and sum(map(len, chunks)) < 65536:
                chunks.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            refused_why = ""
            if status == 201:
                try:
                    created_id = str(json.loads(b"".join(chunks)).get("id") or "")
                except (ValueError, AttributeError):
                    created_id = ""
            elif status == 403:  # a refusal's own words (a 422 may echo the input: not kept)
                refused_why = _why_refused(b"".join(chunks))
            route = scope.get("route")
            params = scope.get("path_params") or {}
            resource = "/".join(f"{k}={v}" for k, v in params.items()) or path
            if created_id:
                resource = f"{resource} id={created_id}" if params else f"id={created_id}"
            outcome = "success" if status < 400 else ("denied" if status in (403, 404) else "failed")
            # A create with an Idempotency-Key wrote its record in its own transaction (kiln.api.idempotency).
            in_transaction = getattr(state.get("idempotency"), "audited", False)
            if (outcome == "denied" or not _reads_by_post(method, path)) and not in_transaction:
                entry = AuditEntry(
                    action=getattr(route, "name", None) or f"{method} {path}"[:96],
                    resource=resource,
                    outcome=outcome,
                    status=status,
                    client=client,
                    org_id=principal.org_id,
                    user_id=principal.user_id,
                    key_id=principal.key_id,
                    # A repeat with an Idempotency-Key: the id is what an earlier request created; nothing new was.
                    # A 403: its error's code and message (a quota, a spent budget: which and why).
                    detail="idempotent replay" if replayed else refused_why,
                )
                await run_in_threadpool(platform.audit.record, entry)

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        principal: Principal,
        client: str,
        error: Forbidden,
        why: str,
        detail: str,
    ) -> None:
        """403 before any route runs (a console request without its CSRF token, a service token off its route),
        audited like a route's refusal when the request would have changed something."""
        method, path = scope["method"], scope.get("path", "")
        log.warning("403 %s %s from %s: %s", method, path, client, why)
        await JSONResponse(error.to_body(), status_code=403)(scope, receive, send)
        if method not in MUTATING:
            return
        entry = AuditEntry(
            action=f"{method} {path}"[:96],
            resource=path,
            outcome="denied",
            status=403,
            client=client,
            org_id=principal.org_id,
            user_id=principal.user_id,
            key_id=principal.key_id,
            detail=detail,
        )
        await run_in_threadpool(scope["app"].state.platform.audit.record, entry)

    async def _authenticate(
        self, scope: Scope, receive: Receive, headers: dict[str, str], platform: object
    ) -> tuple[Principal, Receive, session.ConsoleSession | None]:
        identity = platform.identity  # type: ignore[attr-defined]
        auth = headers.get("authorization", "")
        method = scope["method"]
        path = scope.get("path", "")
        streamed = method == "PUT" and STREAMED_UPLOAD.fullmatch(path) is not None
        if auth.startswith("Bearer kst."):  # a service token: it may predict on its service, nothing else
            principal = await run_in_threadpool(platform.serving.authenticate_token, auth[7:].strip())  # type: ignore[attr-defined]
            return principal, _capped(receive, MAX_SIGNED_BODY), None
        if auth.startswith("Basic ") and path.startswith(MLFLOW_PREFIX):
            key_id, secret = _basic_credentials(auth[6:].strip())
            client = (scope.get("client") or ("", 0))[0]
            allowed = platform.settings.mlflow_basic_auth_over_http  # type: ignore[attr-defined]
            if scope.get("scheme") != "https" and not LOOPBACK.match(client) and not allowed:
                raise AuthFailure("insecure", f"basic auth over http from {client}", message=BASIC_OVER_HTTP)
            # A cached key is checked right here (MLflow's client sends a request per batch); else in a thread.
            principal = identity.authenticate_key(key_id, secret, blocking=False)
            if principal is None:
                principal = await run_in_threadpool(identity.authenticate_key, key_id, secret)
            return principal, receive if streamed else _capped(receive, MAX_SIGNED_BODY), None
        if auth.startswith("Bearer "):
            principal = await run_in_threadpool(identity.authenticate_job_token, auth[7:].strip())
            # The body is not read here (nothing signs it), so the routes that read it whole (logs, metrics, parts)
            # get it through the same cap as a signed body; the streamed uploads keep their own limits.
            return principal, receive if streamed else _capped(receive, MAX_SIGNED_BODY), None
        token = None if auth else session.session_cookie(headers)
        if token is not None:  # the console: no signature, its session cookie (the body is capped as a bearer's)
            principal, console = await session.authenticate(scope["app"], token)
            return principal, receive if streamed else _capped(receive, MAX_SIGNED_BODY), console
        body_hash: str | None = None
        if not streamed:
            body = await _read_body(receive)
            body_hash = signing.body_sha256(body)
            receive = _replay(body, receive)
        request = {
            "method": method,
            "path": (scope.get("raw_path") or path.encode()).decode("latin-1"),
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": headers,
            "body_sha256": body_hash,
            "allow_unsigned_payload": streamed,
        }
        # Most requests are checked right here: the key is cached and (the home's SQLite database) nonces are in
        # memory. The others (a key to load, a nonce to insert into the table) go to a worker thread. A cached key
        # is read again before it expires by a worker thread that no request waits for.
        principal = identity.authenticate_nonblocking(**request)
        if principal is None:
            principal = await run_in_threadpool(identity.authenticate, **request)
        elif identity.refresh_due(principal.key_id):
            _in_background(identity.refresh_key, principal.key_id)
        return principal, receive, None


async def record_unauthenticated(platform: object, method: str, path: str, client: str, exc: AuthFailure) -> None:
    """Log and audit a refused authentication: the one record every entry point writes (this middleware, the
    notebook proxy), so that the trail reads the same whichever was tried."""
    log.warning("401 %s %s from %s: %s %s", method, path, client, exc.reason, exc.log_detail)
    entry = AuditEntry(
        action=f"{method} {path}"[:96],
        resource=path,
        outcome="unauthenticated",
        status=401,
        client=client,
        org_id=exc.org_id,
        user_id=exc.user_id,
        key_id=exc.key_id,
        detail=exc.reason,
    )
    await run_in_threadpool(platform.audit.record, entry)  # type: ignore[attr-defined]


_background: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only a weak reference to a task


def _in_background(fn: Callable[[str], None], arg: str) -> None:
    """``fn(arg)`` in a worker thread, awaited by no request (``fn`` logs its own failures)."""
    task = asyncio.get_running_loop().create_task(run_in_threadpool(fn, arg))
    _background.add(task)
    task.add_done_callback(_background.discard)


def _basic_credentials(encoded: str) -> tuple[str, str]:
    """(key id, secret) from a basic Authorization's base64 ``id:secret``."""
    try:
        key_id, sep, secret = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        raise AuthFailure(
            "malformed", "basic auth not base64", message="basic authentication: not base64 id:secret"
        ) from None
    if not sep or not key_id or not secret:
        raise AuthFailure("malformed", "basic auth without a pair", message="basic authentication: give id:secret")
    return key_id, secret


def _offers_credentials(headers: dict[str, str]) -> bool:
    """Whether a request carries anything that claims an identity: a signature or bearer token, a session cookie,
    or any of the signing headers (a partly signed request is a bad credential, not none)."""
    return (
        "authorization" in headers
        or session.session_cookie(headers) is not None
        or any(name.startswith("x-kiln-") for name in headers)
    )


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


def _capped(receive: Receive, limit: int) -> Receive:
    """``receive`` that raises PayloadTooLarge (413) once the body passes ``limit`` bytes."""
    size = 0

    async def capped() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise PayloadTooLarge(f"request body over {limit} bytes")
        return message

    return capped


def _service_token_route(method: str, path: str) -> bool:
    return method == SERVICE_TOKEN_ROUTE[0] and SERVICE_TOKEN_ROUTE[1].fullmatch(path) is not None


def _reads_by_post(method: str, path: str) -> bool:
    return any(method == m and pattern.fullmatch(path) is not None for m, pattern in READ_BY_POST)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
