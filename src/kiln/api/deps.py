"""Dependencies shared by routes: the platform and the authenticated caller (see kiln.api.auth)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Response
from pydantic import BaseModel

from kiln.errors import Unauthenticated
from kiln.platform import Platform
from kiln.usecases.access.identity import Principal


# Both dependencies are async on purpose: FastAPI runs a plain `def` dependency in the thread pool, which
# costs a thread hand-off per dependency per request for what is a dictionary lookup.
async def get_platform(request: Request) -> Platform:
    return platform_of(request)


async def authenticated(request: Request) -> Principal:
    return caller_of(request)


# The same as plain functions, for hot routes that take the Request and skip dependency solving.
def platform_of(request: Request) -> Platform:
    return request.app.state.platform  # type: ignore[no-any-return]


def caller_of(request: Request) -> Principal:
    principal = request.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal):  # only reachable if a route is mounted outside /api/v1
        raise Unauthenticated("request authentication failed")
    return principal


def model_response(model: BaseModel, status_code: int = 200) -> Response:
    """Serialise a response model directly. FastAPI would validate the returned model against
    ``response_model`` again before serialising it; on hot read routes that doubles the cost."""
    return Response(model.model_dump_json(), media_type="application/json", status_code=status_code)


Caller = Annotated[Principal, Depends(authenticated)]
Kiln = Annotated[Platform, Depends(get_platform)]
