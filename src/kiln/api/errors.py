"""The one place where errors become HTTP responses: ``{"code", "message", "details"?}``."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kiln.errors import InvalidInput, KilnError

log = logging.getLogger("kiln.api")

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


# (path regex, methods) of every route: kiln.api.app stores it on app.state.route_methods.
RouteMethods = list[tuple[re.Pattern[str], frozenset[str]]]


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path. The router's own 405 names only the first route that
    matched the path, and a path such as /api/v1/jobs has one route per method."""
    table: RouteMethods = getattr(request.app.state, "route_methods", [])
    path = request.url.path
    return sorted({method for regex, methods in table if regex.match(path) for method in methods})


def _location(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def error_response(exc: KilnError) -> JSONResponse:
    """A Kiln error's one response: its body and status, and for a 503 with ``details.retry_after`` (a service with
    no ready replica, the database unavailable) a Retry-After header. Routes reach it through the handler below; the
    signature middleware, which runs before any route, calls it itself."""
    headers = None
    if exc.status == 503 and isinstance(exc.details, dict) and "retry_after" in exc.details:
        headers = {"Retry-After": str(exc.details["retry_after"])}
    return JSONResponse(exc.to_body(), status_code=exc.status, headers=headers)


def _unparsable_body(cause: BaseException) -> InvalidInput:
    if isinstance(cause, UnicodeDecodeError):
        why = f"not UTF-8 (byte {cause.start})"
    elif isinstance(cause, RecursionError):
        why = "nested too deeply"
    else:
        why = "not JSON"
    message = f"body: {why}"
    return InvalidInput(f"invalid request: {message}", details=[{"field": "body", "message": why}])


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(KilnError)
    async def _kiln_error(_request: Request, exc: KilnError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            loc = _location(tuple(err.get("loc", ())))
            msg = str(err.get("msg", "invalid"))
            if err.get("type") == "extra_forbidden":
                msg = "unknown field"
            elif err.get("type") == "json_invalid":  # loc is ("body", the character's position)
                where = err.get("loc", ("body", 0))[-1]
                loc, msg = "body", f"not JSON: {(err.get('ctx') or {}).get('error', msg)} (character {where})"
            problems.append({"field": loc, "message": msg})
        text = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5])
        return JSONResponse(InvalidInput(f"invalid request: {text}", details=problems).to_body(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, KilnError):  # FastAPI turns an error while it reads a body into a 400
            return JSONResponse(exc.__cause__.to_body(), status_code=exc.__cause__.status)
        if exc.status_code == 400 and exc.__cause__ is not None:
            # A JSON body that is not JSON for a reason other than its syntax (bytes that are not UTF-8, nesting
            # deeper than the parser goes): FastAPI answers 400, its syntax errors 422; both are the body's fault.
            return JSONResponse(_unparsable_body(exc.__cause__).to_body(), status_code=422)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # RFC 9110: a 405 says which methods the resource has
            headers["Allow"] = ", ".join(allowed_methods(request))
        return JSONResponse(
            {"code": code, "message": str(exc.detail)}, status_code=exc.status_code, headers=headers or None
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, KilnError):
            # Raised by a middleware outside a route (the routes' go to the handler above): still its own answer, e.g.
            # 503 database_unavailable rather than 500.
            log.warning("%s %s: %s", request.method, request.url.path, exc)
            return error_response(exc)
        # Tracebacks stay in the server log; clients get a stable code.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"code": "internal", "message": "internal server error"}, status_code=500)
