"""NUL characters (U+0000) are refused in whatever a route reads as text, before any route runs.

PostgreSQL cannot store U+0000 in a text value: a NUL in an id that a route looked up, a filter or a JSON field
reached the database and failed there (500, on PostgreSQL only; SQLite answered 404). No id, name, path or filter of
Kiln can hold one, so one middleware refuses them on every route, on either database:

- in a path parameter of the route the path names: 422 naming it (``path.job_id``); a path that names no route is
  left to the router (404, 405), which reads nothing;
- in a query parameter (its name or value): 422 naming it (``query.before``);
- in a JSON body (what FastAPI parses as JSON: ``application/json``, ``application/*+json`` or no content type),
  ``\\u0000`` in a string or a key: 422 naming the field (``spec.name``, ``files.0.path``) as a validation error
  does. A body is parsed here only when its bytes hold ``\\u0000``.

Left out: the bodies of requests outside ``/api/v1/`` and ``/mlflow/`` (the notebook proxy's go to JupyterLab,
read only once their caller is known: kiln.api.notebook_proxy), the bodies a route streams itself (bundles,
artifacts and checkpoints) and a predict's body, which is
the model's input, forwarded to a replica and never stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from typing import Any
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln.api.auth import API_PREFIX, MLFLOW_PREFIX, SERVICE_TOKEN_ROUTE, STREAMED_UPLOAD
from kiln.api.errors import RouteMethods
from kiln.errors import InvalidInput, KilnError

NUL = "\x00"
NOT_ALLOWED = "must not contain a NUL character (\\u0000)"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PREDICT = SERVICE_TOKEN_ROUTE[1]  # POST /api/v1/services/NAME/predict
MOST_FIELDS = 10  # named in details; the message names the first 5 as a validation error's does


class NulGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fields: list[str] = []
        if NUL in scope.get("path", ""):
            fields += _path_fields(scope)
        query: bytes = scope.get("query_string", b"")
        if b"%00" in query or b"\x00" in query:
            fields += _query_fields(query)
        if not fields and scope["method"] in BODY_METHODS and _json_body(scope):
            try:
                body, receive = await _buffer(receive)
            except KilnError as exc:  # the body is over the signed-body cap (kiln.api.auth)
                await JSONResponse(exc.to_body(), status_code=exc.status)(scope, receive, send)
                return
            if b"\\u0000" in body:
                fields += _body_fields(body)
        if fields:
            await _refuse(fields)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _refuse(fields: list[str]) -> JSONResponse:
    details = [{"field": field, "message": NOT_ALLOWED} for field in fields[:MOST_FIELDS]]
    text = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
    return JSONResponse(InvalidInput(f"invalid request: {text}", details=details).to_body(), status_code=422)


def _shown(name: str) -> str:
    return name.replace(NUL, "\\u0000")


def _path_fields(scope: Scope) -> list[str]:
    """The path parameters holding a NUL, of the route that answers this method and path (kiln.api.app's table of
    every route's path regex); none when no route does (the router answers 404 or 405, reading nothing)."""
    table: RouteMethods = getattr(scope["app"].state, "route_methods", [])
    path, method = scope.get("path", ""), scope["method"]
    for regex, methods in table:
        match = regex.match(path)
        if match is not None and method in methods:
            return [f"path.{name}" for name, value in match.groupdict().items() if NUL in value]
    return []


def _query_fields(query: bytes) -> list[str]:
    # As Starlette reads a query (kiln.api routes get theirs from it): percent-decoded as UTF-8.
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    names = [name for name, value in pairs if NUL in name or NUL in value]
    return [f"query.{_shown(name)}" for name in dict.fromkeys(names)]


def _json_body(scope: Scope) -> bool:
    """Whether FastAPI would parse the body as JSON (kiln.api.auth caps it, except on the streamed uploads). Only
    under the prefixes kiln.api.auth authenticates and caps before this runs: anywhere else (the notebook proxy,
    which authenticates on the headers and streams the body on) a body buffered here was read whole, uncapped and
    before its caller was known: 250 MB of an unauthenticated request held in memory."""
    path = scope.get("path", "")
    if not path.startswith((API_PREFIX, MLFLOW_PREFIX)):
        return False
    if STREAMED_UPLOAD.fullmatch(path) or PREDICT.fullmatch(path):
        return False
    content_type = ""
    for name, value in scope["headers"]:
        if name == b"content-type":
            content_type = value.decode("latin-1").split(";", 1)[0].strip().lower()
            break
    if not content_type:
        return True
    kind, _, subtype = content_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def _buffer(receive: Receive) -> tuple[bytes, Receive]:
    """The whole body, and a ``receive`` that hands the same messages over again, then the real one's."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")

    async def replay() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return body, replay


def _body_fields(body: bytes) -> list[str]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON: FastAPI answers 422 saying so
        return []
    return list(islice(_nul_locations(data), MOST_FIELDS))


def _nul_locations(data: Any) -> Iterator[str]:
    """Where ``data`` holds a NUL in a string or a key, as a validation error names a field (``files.0.path``)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        location, value = stack.pop()
        if isinstance(value, str):
            if NUL in value:
                yield location or "body"
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                inner = f"{location}.{_shown(key)}" if location else _shown(key)
                if NUL in key:
                    yield inner
                stack.append((inner, item))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((f"{location}.{i}" if location else str(i), value[i]))
