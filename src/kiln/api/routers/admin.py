"""The platform's own state, for its operators (platform admins only): which servers share the database and what
each holds."""

from __future__ import annotations

from fastapi import APIRouter

from kiln.api.deps import Caller, Kiln
from kiln.api.responses import errors
from kiln.domain.servers import ServerList

router = APIRouter(prefix="/admin", tags=["administration"], responses=errors(403))


@router.get(
    "/servers",
    response_model=ServerList,
    summary="The servers on this database, live or not, and the jobs and task leases each holds (platform admin)",
)
def list_servers(caller: Caller, kiln: Kiln) -> ServerList:
    return kiln.server_directory.list_servers(caller)
