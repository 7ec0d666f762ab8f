"""The one place where errors become HTTP responses: ``{"code", "message", "details"?}``."""

from __future__ import annotations

import logging

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
}


def _location(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(KilnError)
    async def _kiln_error(_request: Request, exc: KilnError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            loc = _location(tuple(err.get("loc", ())))
            msg = str(err.get("msg", "invalid"))
            if err.get("type") == "extra_forbidden":
                msg = "unknown field"
            problems.append({"field": loc, "message": msg})
        text = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5])
        return JSONResponse(InvalidInput(f"invalid request: {text}", details=problems).to_body(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return JSONResponse({"code": code, "message": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Tracebacks stay in the server log; clients get a stable code.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"code": "internal", "message": "internal server error"}, status_code=500)
