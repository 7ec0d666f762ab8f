"""The servers that share a database, as they record themselves in ``servers``.

Every server (task ``server-presence``) writes its row — its instance id, its endpoint, ``seen_at`` — every
heartbeat (``KILN_SERVER_HEARTBEAT_SECONDS``), counts the rows seen within the last three heartbeats, and hands
that count to whoever needs it (the rate limiter enforces ``1 / live`` of each caller's limit). A server deletes
its row when it stops; one that died keeps counting until its row is three heartbeats old, and rows unseen for an
hour are deleted by whichever server beats next. ``seen_at`` is each server's own clock, compared with the
counting server's: the servers' clocks must agree to well within a heartbeat, as the task leases already need.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from kiln.db.session import Database
from kiln.db.tables import Server, utcnow
from kiln.tasks.runner import Task, TaskContext
from kiln.version import full_version

log = logging.getLogger(__name__)

LIVE_HEARTBEATS = 3  # a server unseen for this many heartbeats is not counted
FORGET_AFTER = timedelta(hours=1)  # ... and its row is deleted once unseen this long


class ServerPresence:
    """This server's row in ``servers`` and the count of live servers (at least 1: this one)."""

    def __init__(
        self,
        db: Database,
        instance_id: str,
        endpoint: str,
        heartbeat_seconds: float,
        on_count: Callable[[int], None] | None = None,
    ) -> None:
        if heartbeat_seconds <= 0:
            raise ValueError(f"heartbeat_seconds: more than 0, not {heartbeat_seconds}")
        self.db = db
        self.instance_id = instance_id
        self.endpoint = endpoint
        self.heartbeat = heartbeat_seconds
        self.on_count = on_count
        self.live = 1
        self._started = utcnow()
        # Who it is, for ``kiln admin servers``: the machine, the process and the release it runs.
        self._identity = {"host": socket.gethostname(), "pid": os.getpid(), "version": full_version()}
        self._insert = postgresql_insert if db.dialect == "postgresql" else sqlite_insert

    def live_for(self) -> float:
        """Seconds since its last heartbeat within which a server counts as live."""
        return LIVE_HEARTBEATS * self.heartbeat

    def task(self) -> Task:
        """The heartbeat as a background task of every server (no lease: each records itself)."""
        return Task("server-presence", self._run, self.heartbeat, stop=self.leave)

    def _run(self, ctx: TaskContext) -> None:
        self.beat()

    def beat(self) -> int:
        """Record this server as seen now and count the live servers (this one included); the count."""
        now = utcnow()
        until = now + timedelta(seconds=self.live_for())  # by its own heartbeat: another's may differ
        row = {"endpoint": self.endpoint, "started_at": self._started, "seen_at": now, "live_until": until}
        row |= self._identity
        upsert = (
            self._insert(Server)
            .values(id=self.instance_id, **row)
            .on_conflict_do_update(index_elements=["id"], set_=row)
        )
        with self.db.transaction() as s:
            s.execute(upsert)
            s.execute(delete(Server).where(Server.seen_at < now - FORGET_AFTER))
            live = s.scalar(
                select(func.count())
                .select_from(Server)
                .where(
                    or_(
                        Server.live_until >= now,
                        and_(
                            Server.live_until.is_(None),
                            Server.seen_at >= now - timedelta(seconds=LIVE_HEARTBEATS * self.heartbeat),
                        ),
                    )
                )
            )
        count = max(1, int(live or 0))
        if count != self.live:
            log.info("%d live servers on the database (were %d)", count, self.live)
        self.live = count
        if self.on_count is not None:
            self.on_count(count)
        return count

    def leave(self) -> None:
        """Delete this server's row (at shutdown): the others stop counting it at their next heartbeat."""
        try:
            with self.db.transaction() as s:
                s.execute(delete(Server).where(Server.id == self.instance_id))
        except Exception:
            log.exception("could not delete this server's row of the live servers; it stops counting once stale")
