"""What GET /api/v1/admin/servers answers: the servers sharing the database, and which jobs and task leases each
holds (issue 44: after a takeover nothing but the database said who held what)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ServerRead(BaseModel):
    """One server, as its heartbeat records it, with what it holds now. A holder with no row (it stopped, or
    was forgotten an hour after it went quiet, and its jobs' leases have not been taken over yet) is listed too,
    with only its id: its jobs wait for their leases to run out."""

    id: str = Field(description="Its instance id (KILN_INSTANCE_ID): the owner its leases name.")
    endpoint: str | None = None
    host: str | None = Field(None, description="The machine it runs on (None: a row from before 0.2).")
    pid: int | None = Field(None, description="Its process id on that machine.")
    version: str | None = Field(None, description="The release and commit it runs, e.g. 0.2.0+g1f6b6de.")
    started_at: datetime | None = None
    seen_at: datetime | None = Field(None, description="Its last heartbeat.")
    live_until: datetime | None = Field(None, description="When it stops counting as live without a heartbeat.")
    live: bool = Field(description="Whether its last heartbeat is recent enough for it to count as live now.")
    jobs: int = Field(0, description="How many open jobs' leases name it (an expired one: waiting for a takeover).")
    job_ids: list[str] = Field(default_factory=list, description="Those jobs, oldest first.")
    task_leases: list[str] = Field(
        default_factory=list, description="The background tasks' lease scopes it holds unexpired (studies, ...)."
    )


class ServerList(BaseModel):
    items: list[ServerRead]
    now: datetime = Field(description="The server's clock when it answered: what live and the leases are judged by.")
