"""Health and identity."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln
from kiln.api.responses import errors, links
from kiln.db import migrate
from kiln.domain.schemas import WhoAmI
from kiln.errors import KilnError
from kiln.version import full_version

health = APIRouter(tags=["health"])
router = APIRouter(tags=["identity"])


class TaskReport(BaseModel):
    """One background task of this server (times in ISO 8601, UTC)."""

    name: str
    running: bool
    interval_seconds: float
    lease_scope: str | None = Field(None, description="Set: one server at a time runs the task.")
    holds_lease: bool | None = Field(None, description="Whether this server held the lease at its last try.")
    runs: int
    errors: int
    last_run: str | None = None
    last_duration_seconds: float | None = None
    last_run_ok: bool | None = None
    last_error: str | None = Field(None, description="The type and message of the latest run that failed.")
    last_error_at: str | None = None
    next_run: str | None = None


class Readiness(BaseModel):
    status: str = "ready"
    version: str = Field(description="Kiln's release and the commit it was built from, e.g. 0.2.0+g1f6b6de.")
    message: str | None = Field(None, description="What is wrong, when the server is not ready.")
    tasks: list[TaskReport] = Field(default_factory=list, description="The server's background tasks.")
    servers: int = Field(
        1,
        description="The live servers on this database at this server's last heartbeat (itself included); each "
        "enforces 1/servers of every rate limit.",
    )


@health.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@health.get(
    "/readyz",
    summary="The database is reachable and migrated",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready: the message says why"}},
)
async def readyz(kiln: Kiln) -> JSONResponse:
    def check() -> str | None:
        try:
            kiln.db.ping()
            if not migrate.is_up_to_date(kiln.db.engine):
                return "database migrations are not applied"
        except KilnError as exc:
            return exc.message
        return None

    problem = await run_in_threadpool(check)
    tasks = [task.as_dict() for task in kiln.tasks.status()]
    servers = kiln.servers.live
    if problem:
        body = {
            "status": "unavailable",
            "version": full_version(),
            "message": problem,
            "tasks": tasks,
            "servers": servers,
        }
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "version": full_version(), "tasks": tasks, "servers": servers})


@router.get(
    "/whoami",
    response_model=WhoAmI,
    responses={
        **errors(403),  # 403: a service token, which may only predict (kiln.api.auth)
        **links(
            200,
            "The caller",
            get_user={"user": "$response.body#/user_id"},
            get_org={"org": "$response.body#/org_id"},
        ),
    },
)
async def whoami(caller: Caller) -> WhoAmI:  # no I/O: async, so no worker-thread hand-off
    return WhoAmI(
        user_id=caller.user_id,
        user_name=caller.user_name,
        org_id=caller.org_id,
        org_name=caller.org_name,
        access_key=caller.key_id,
        platform_admin=caller.platform_admin,
        role=caller.role,
        job_id=caller.job_id,
    )
