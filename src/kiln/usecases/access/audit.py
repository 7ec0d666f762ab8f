"""The audit trail: every mutating request and every failed authentication, kept for a retention period.

Records hold who (organisation, user, key id), what (action, resource), the outcome and the client address —
never a secret, a signature or a request body.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import AuditEvent, Organization, User, utcnow
from kiln.domain.schemas import AuditRead
from kiln.usecases.access.accounts import find_org
from kiln.usecases.access.identity import Principal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditEntry:
    action: str
    resource: str
    outcome: str
    status: int
    client: str
    org_id: str | None = None
    user_id: str | None = None
    key_id: str | None = None
    detail: str = ""


def _text(value: str) -> str:
    """``value`` as PostgreSQL can store it: a NUL (a refused request's path, say) written as ``\\u0000``."""
    return value.replace("\x00", "\\u0000")


def _read(row: AuditEvent, org_name: str | None, user_name: str | None) -> AuditRead:
    return AuditRead(
        id=row.id,
        time=row.time,
        org_id=row.org_id,
        user_id=row.user_id,
        org_name=org_name,
        user_name=user_name,
        key_id=row.key_id,
        action=row.action,
        resource=row.resource,
        outcome=row.outcome,
        status=row.status,
        client=row.client,
        detail=row.detail,
    )


def add(s: Session, entry: AuditEntry) -> None:
    """The record of ``entry``, in the transaction ``s``: a create's own (kiln.usecases.access.idempotency), so that
    the record of what it created commits with it or not at all."""
    s.add(
        AuditEvent(
            time=utcnow(),
            org_id=entry.org_id,
            user_id=entry.user_id,
            key_id=_text(entry.key_id or "")[:64] or None,
            action=_text(entry.action)[:96],
            resource=_text(entry.resource)[:512],
            outcome=entry.outcome[:32],
            status=entry.status,
            client=_text(entry.client)[:64],
            detail=_text(entry.detail)[:256],
        )
    )


class AuditService:
    def __init__(self, db: Database, retention_days: float) -> None:
        self.db = db
        self.retention_days = retention_days

    def record(self, entry: AuditEntry) -> None:
        try:
            with self.db.transaction() as s:
                add(s, entry)
        except Exception:  # the request already happened; a lost audit row is logged loudly, not raised
            log.exception("could not write audit record for %s %s", entry.action, entry.resource)

    def query(
        self,
        principal: Principal,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        user: str | None = None,
        action: str | None = None,
        org: str | None = None,
        outcome: str | None = None,
        limit: int = 100,
    ) -> list[AuditRead]:
        principal.require("audit:read")
        with self.db.read() as s:
            # The names people read, joined in the same query (one query for the page, not one per record).
            query = (
                select(AuditEvent, Organization.name, User.name)
                .outerjoin(Organization, Organization.id == AuditEvent.org_id)
                .outerjoin(User, User.id == AuditEvent.user_id)
                .order_by(AuditEvent.id.desc())
                .limit(limit)
            )
            if org is not None:
                query = query.where(AuditEvent.org_id == find_org(s, principal, org).id)
            elif not principal.platform_admin:
                query = query.where(AuditEvent.org_id == principal.org_id)
            if since is not None:
                query = query.where(AuditEvent.time >= since)
            if until is not None:
                query = query.where(AuditEvent.time <= until)
            if user is not None:
                ids = list(s.scalars(select(User.id).where((User.id == user) | (User.name == user))))
                query = query.where(AuditEvent.user_id.in_(ids))
            if action is not None:
                query = query.where(AuditEvent.action.contains(action))
            if outcome is not None:
                query = query.where(AuditEvent.outcome == outcome)
            return [_read(row, org_name, user_name) for row, org_name, user_name in s.execute(query)]

    def purge(self, s: Session) -> int:
        """Delete the events past their retention, in ``s`` (the leased task ``purge-audit``'s fenced
        transaction); how many went."""
        cutoff = utcnow() - timedelta(days=self.retention_days)
        result = s.execute(delete(AuditEvent).where(AuditEvent.time < cutoff))
        return int(getattr(result, "rowcount", 0) or 0)
