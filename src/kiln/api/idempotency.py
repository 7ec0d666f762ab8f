"""The ``Idempotency-Key`` header of the create routes (docs/idempotency.md): read and checked here, handed to the
create's service (kiln.usecases.access.idempotency), which keeps it in the create's own transaction."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response

from kiln.api.responses import errors
from kiln.domain.idempotency import HEADER, KEY_PATTERN, MAX_KEY_LENGTH, REPLAYED_HEADER
from kiln.usecases.access.audit import AuditEntry
from kiln.usecases.access.idempotency import IdempotentRequest

KEY_DESCRIPTION = (
    "Makes a retried create harmless: a repeat of this request (same method, path and body) by the same user with "
    "the same key, within the server's retention (24 h by default), creates nothing and answers the resource the "
    "first one created, with the header "
    f"{REPLAYED_HEADER}: true. The same key with another request is a 422. 1 to {MAX_KEY_LENGTH} printable ASCII "
    "characters; a UUID per logical create is what the SDK sends."
)


async def idempotent_request(
    request: Request,
    key: Annotated[
        str | None,
        # Checked by IdempotentRequest.of (a 422 that names the header and says what is wrong); the pattern here is
        # what the OpenAPI document says of it.
        Header(
            alias=HEADER,
            description=KEY_DESCRIPTION,
            max_length=MAX_KEY_LENGTH,
            json_schema_extra={"pattern": KEY_PATTERN},
        ),
    ] = None,
) -> IdempotentRequest | None:
    if key is None:
        return None
    # The body FastAPI has already read for the route (Starlette keeps it): hashed, with the method and the path.
    idempotent = IdempotentRequest.of(key, request.method, request.url.path, await request.body())
    idempotent.audit = _audit_entry(request)
    # Where kiln.api.auth looks after the route: a create that wrote its audit record with its key is not
    # recorded a second time.
    request.state.idempotency = idempotent
    return idempotent


def _audit_entry(request: Request) -> AuditEntry | None:
    """The record kiln.api.auth would write for this request once it created something, as the create's
    transaction writes it with the key (kiln.usecases.access.idempotency): the same action, resource and who."""
    principal = getattr(request.state, "principal", None)
    route = request.scope.get("route")
    if principal is None or route is None:
        return None
    return AuditEntry(
        action=route.name,
        resource="/".join(f"{k}={v}" for k, v in request.path_params.items()),
        outcome="success",
        status=getattr(route, "status_code", None) or 201,
        client=request.client.host if request.client else "-",
        org_id=principal.org_id,
        user_id=principal.user_id,
        key_id=principal.key_id,
    )


Idempotent = Annotated[IdempotentRequest | None, Depends(idempotent_request)]

# The response header, for the 201 entries of the create routes in the OpenAPI document.
REPLAYED: dict[str, Any] = {
    REPLAYED_HEADER: {
        "description": "'true' when this answers a repeat of an earlier request with the same Idempotency-Key: "
        "the resource that request created (read as it is now); absent otherwise",
        "schema": {"type": "string", "enum": ["true"]},
    }
}


def replayable(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a create route with the replay header on its 201 entry, and its 409: an Idempotency-Key
    reused with another request, or whose resource has been removed since (every such route answers it)."""
    created = dict(responses.get(201, {"description": "Created"}))
    created["headers"] = {**created.get("headers", {}), **REPLAYED}
    return {**errors(409), **responses, 201: created}


def mark_replayed(response: Response, request: IdempotentRequest | None) -> None:
    """Say on ``response`` that it answers an earlier request's create (``request.replayed``)."""
    if request is not None and request.replayed:
        response.headers[REPLAYED_HEADER] = "true"
