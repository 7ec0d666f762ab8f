"""Leases of background tasks (``task_leases``): one row per scope, held by one server at a time, with a fencing
token.

The token is a counter that goes up whenever the lease changes hands: another owner takes it, or its own owner
takes it back after it expired (it may have been taken and lost in between without a trace here). A holder that
stalled past its lease (a long pause, a slow disk) still believes it holds the lease; the token is how its writes
are refused: a writer checks ``check(s, scope, owner, token)`` inside its own transaction, and a stale token
fails there, whatever the holder believes.

Acquiring and renewing is one transaction on both SQLite (``BEGIN IMMEDIATE``: the write lock is taken first) and
PostgreSQL (``INSERT ... ON CONFLICT DO NOTHING`` then ``SELECT ... FOR UPDATE`` of the one row).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import TaskLease, utcnow


@dataclass(frozen=True)
class Held:
    """A lease as its holder got it: the scope, the fencing token and when it runs out unrenewed."""

    scope: str
    token: int
    expires_at: datetime


class TaskLeases:
    """Takes, renews, checks and gives back leases of ``task_leases`` for one owner (a server's instance id)."""

    def __init__(self, db: Database, owner: str) -> None:
        self.db = db
        self.owner = owner

    def acquire(self, scope: str, seconds: float) -> Held | None:
        """Take the lease of ``scope`` or renew it, for ``seconds``; None while another owner holds it."""
        now = utcnow()
        expires = now + timedelta(seconds=seconds)
        insert = postgresql_insert if self.db.dialect == "postgresql" else sqlite_insert
        with self.db.transaction() as s:
            # The first owner ever creates the row; from then on the row is locked and updated in place.
            created = s.execute(
                insert(TaskLease)
                .values(scope=scope, owner=self.owner, token=1, acquired_at=now, expires_at=expires)
                .on_conflict_do_nothing(index_elements=["scope"])
                .returning(TaskLease.token)
            ).first()
            if created is not None:
                return Held(scope, 1, expires)
            row = s.scalars(select(TaskLease).where(TaskLease.scope == scope).with_for_update()).one()
            if row.expires_at > now and row.owner != self.owner:
                return None
            if row.expires_at <= now:
                # Expired: whoever takes it now (its old owner too) may not be the last writer, so a new token.
                row.token += 1
                row.owner = self.owner
                row.acquired_at = now
            row.expires_at = expires
            return Held(scope, row.token, expires)

    def check(self, s: Session, scope: str, token: int) -> bool:
        """Inside a writer's transaction ``s``: does this owner still hold ``scope`` with ``token``, unexpired? On
        PostgreSQL the row stays locked to the end of ``s``, so that it cannot change hands before the write
        commits (on SQLite the writer's transaction holds the database's write lock already)."""
        query = select(TaskLease.owner, TaskLease.token, TaskLease.expires_at).where(TaskLease.scope == scope)
        if self.db.dialect == "postgresql":
            query = query.with_for_update()
        row = s.execute(query).one_or_none()
        return row is not None and row.owner == self.owner and row.token == token and row.expires_at > utcnow()

    def holds(self, scope: str, token: int) -> bool:
        """``check`` in a transaction of its own (a read: on SQLite it waits for no writer, and a task fences
        each backend call with it)."""
        with self.db.read() as s:
            return self.check(s, scope, token)

    def release(self, scope: str, token: int) -> None:
        """Give the lease back (at shutdown), so that another server takes it at once rather than after it
        expires. Its token stays: the next owner's is one higher."""
        with self.db.transaction() as s:
            row = s.scalars(select(TaskLease).where(TaskLease.scope == scope).with_for_update()).one_or_none()
            if row is not None and row.owner == self.owner and row.token == token:
                row.expires_at = utcnow()
