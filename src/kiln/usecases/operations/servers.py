"""Who holds what (``GET /api/v1/admin/servers``, ``kiln admin servers``): every server the ``servers`` table
records, whether it is live, and the open jobs and background-task leases each holds. Platform admins only: the
jobs are every organisation's, and the servers' hosts and processes are the platform's.

A lease's owner is a server's instance id. A job whose lease names a server that is gone stays that server's until
its lease runs out and another takes it over (``kiln.scheduler.leases``): such an owner is listed as well, not
live, so that nothing held is left out."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from kiln.db.session import Database
from kiln.db.tables import Job, Server, TaskLease, utcnow
from kiln.domain.servers import ServerList, ServerRead
from kiln.domain.states import JobState
from kiln.usecases.access.identity import Principal

OPEN_STATES = [str(state) for state in JobState if not state.terminal]
LIVE_HEARTBEATS = 3  # as kiln.tasks.presence counts them: a row from before live_until is judged by the reader's


class ServerDirectory:
    def __init__(self, db: Database, heartbeat_seconds: float) -> None:
        self.db = db
        self.heartbeat = heartbeat_seconds

    def list_servers(self, principal: Principal) -> ServerList:
        principal.require("servers:read")
        now = utcnow()
        with self.db.read() as s:  # one snapshot: a job is counted once, whoever holds it
            servers = list(s.scalars(select(Server)))
            jobs = s.execute(
                select(Job.id, Job.lease_owner)
                .where(Job.state.in_(OPEN_STATES), Job.lease_owner.is_not(None))
                .order_by(Job.created_at, Job.id)
            ).all()
            leases = s.execute(
                select(TaskLease.scope, TaskLease.owner).where(TaskLease.expires_at > now).order_by(TaskLease.scope)
            ).all()
        held: dict[str, list[str]] = {}
        for job_id, owner in jobs:
            if owner is not None:  # the query's filter: for the type checker
                held.setdefault(owner, []).append(job_id)
        scopes: dict[str, list[str]] = {}
        for scope, owner in leases:
            scopes.setdefault(owner, []).append(scope)
        items = [
            ServerRead(
                id=row.id,
                endpoint=row.endpoint,
                host=row.host,
                pid=row.pid,
                version=row.version,
                started_at=row.started_at,
                seen_at=row.seen_at,
                live_until=row.live_until,
                live=self._live(row, now),
                jobs=len(held.get(row.id, [])),
                job_ids=held.get(row.id, []),
                task_leases=scopes.get(row.id, []),
            )
            for row in servers
        ]
        known = {row.id for row in servers}
        for owner in sorted((held.keys() | scopes.keys()) - known):
            items.append(
                ServerRead(
                    id=owner,
                    live=False,
                    jobs=len(held.get(owner, [])),
                    job_ids=held.get(owner, []),
                    task_leases=scopes.get(owner, []),
                )
            )
        items.sort(key=lambda x: (not x.live, x.started_at.timestamp() if x.started_at else float("inf"), x.id))
        return ServerList(items=items, now=now)

    def _live(self, row: Server, now: datetime) -> bool:
        if row.live_until is not None:
            return row.live_until >= now
        return row.seen_at >= now - timedelta(seconds=LIVE_HEARTBEATS * self.heartbeat)
