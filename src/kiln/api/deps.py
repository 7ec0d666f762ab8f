"""Dependencies shared by routes: the platform and the authenticated caller (see kiln.api.auth)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from kiln.errors import Unauthenticated
from kiln.platform import Platform
from kiln.services.identity import Principal


def get_platform(request: Request) -> Platform:
    return request.app.state.platform  # type: ignore[no-any-return]


def authenticated(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):  # only reachable if a route is mounted outside /api/v1
        raise Unauthenticated("request authentication failed")
    return principal


Caller = Annotated[Principal, Depends(authenticated)]
Kiln = Annotated[Platform, Depends(get_platform)]
