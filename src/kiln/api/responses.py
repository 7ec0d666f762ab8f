"""What the OpenAPI schema says a route answers besides success: its error statuses, each with the one error body
kiln.api.errors writes (``{"code", "message", "details"?}``: kiln.domain.schemas.ErrorBody), and the links from a
response to the operations that use what it returns (a created job's id, say)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import RedirectResponse, Response, StreamingResponse

from kiln.domain.schemas import ErrorBody

DESCRIPTIONS = {
    400: "The input is well-formed but wrong (a digest that does not match, a part that does not exist, ...).",
    401: "Not signed, or the signature, its date or its nonce is refused (details.reason says which).",
    403: "Not allowed to the caller: its role, a job token's scope, or a quota (the message has the numbers).",
    404: "Not found, or not the caller's to see (the same answer either way).",
    409: "Conflicts with the state of what it names (the message says what, details may list it).",
    413: "The body, or a size it declares, is over a platform maximum (docs/storage.md lists them).",
    422: "Invalid input: details lists each field with what is wrong with it.",
    429: "Too many requests from this access key; Retry-After says in how many seconds to try again.",
    502: "What the request was forwarded to failed to answer (a service's replicas, even after one retry).",
    503: "Nothing can answer now: the database is unavailable (database_unavailable), or a service has no ready "
    "replica (no_replica); Retry-After says in how many seconds to retry.",
}
# What every signed route (/api/v1) may answer whatever it does: before any route runs, the middleware refuses
# requests without a valid signature (401), bodies over 16 MiB (413) and callers over their rate (429); and
# checking a signature (its key, its nonce) needs the database, which may be unavailable (503).
SIGNED = (401, 413, 429, 503)
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "string"}, "required": True}}


def errors(*statuses: int, signed: bool = True) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for these error statuses (and, for a signed route, SIGNED's)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, *(SIGNED if signed else ())}):
        entry: dict[str, Any] = {"model": ErrorBody, "description": DESCRIPTIONS[status]}
        if status in (429, 503):
            entry["headers"] = _RETRY_AFTER
        out[status] = entry
    return out


def links(status: int, description: str, **targets: dict[str, str]) -> dict[int | str, dict[str, Any]]:
    """A ``responses=`` entry for the success ``status`` whose links lead to the operations named in ``targets``
    (operation id → {parameter: runtime expression}), e.g. ``get_job={"job_id": "$response.body#/id"}``."""
    return {
        status: {
            "description": description,
            "links": {name: {"operationId": name, "parameters": params} for name, params in targets.items()},
        }
    }


def with_links(
    error_statuses: tuple[int, ...], success: dict[int | str, dict[str, Any]]
) -> dict[int | str, dict[str, Any]]:
    return {**errors(*error_statuses), **success}


REDIRECT: dict[int | str, dict[str, Any]] = {
    307: {"description": "A short-lived store URL to read the bytes from (S3 stores)"}
}


def raw_body(media_type: str) -> dict[str, Any]:
    """``openapi_extra=`` for a route that reads its body as bytes (a bundle, a part, log or metric lines): any
    bytes of that media type, which the route itself checks."""
    schema = {"type": "string", "format": "binary"}
    return {"requestBody": {"required": True, "content": {media_type: {"schema": schema}}}}


def stored_file(store: Any, key: str, sha256: str, size: int, presigned_url: str | None) -> Response:
    """A stored blob's bytes as a response: a 307 to ``presigned_url`` where the store gives one (S3), else
    streamed; with its digest and size as headers either way."""
    headers = {"X-Kiln-SHA256": sha256, "X-Kiln-Size": str(size)}
    if presigned_url is not None:
        return RedirectResponse(presigned_url, status_code=307, headers=headers)
    store.size(key)  # 404/503 now, before the response starts
    headers["Content-Length"] = str(size)
    return StreamingResponse(
        store.iter_bytes(key, 4 * 1024 * 1024), media_type="application/octet-stream", headers=headers
    )
