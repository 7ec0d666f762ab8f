"""Who: organisations, users, access keys, request nonces, idempotency keys, the audit trail."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class Organization(Base):
    __tablename__ = "organizations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    # Fair-share weight between organisations with pending work (2.0: twice the share of a 1.0 organisation).
    share_weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")
    # The highest priority class its members may submit at; only a platform admin raises it.
    max_priority: Mapped[str] = mapped_column(String(16), default="normal", server_default="normal")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16), default="member")
    platform_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AccessKey(Base):
    __tablename__ = "access_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    secret_encrypted: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(String(256), default="", server_default="")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class Nonce(Base):
    """Nonces seen per key inside the replay window; the primary key makes a replay fail to insert."""

    __tablename__ = "nonces"

    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    seen_at: Mapped[datetime] = mapped_column(index=True)


class IdempotencyKey(Base):
    """A create's ``Idempotency-Key`` (kiln.usecases.access.idempotency): written in the transaction that creates the
    resource, so a key names either nothing or the one resource its request made. The primary key scopes a key to
    one user of one organisation and is what decides between concurrent requests with the same key."""

    __tablename__ = "idempotency_keys"

    org_id: Mapped[str] = mapped_column(String(32), primary_key=True)  # no foreign keys: rows expire in a day
    user_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))  # kiln.domain.idempotency.fingerprint
    resource_kind: Mapped[str] = mapped_column(String(32))  # job, study, service, model version
    resource_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class AuditEvent(Base):
    """One mutating request or failed authentication. Never holds a secret, a body or a signature."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    org_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    user_id: Mapped[str | None] = mapped_column(String(32), default=None)
    key_id: Mapped[str | None] = mapped_column(String(64), default=None)
    action: Mapped[str] = mapped_column(String(96))
    resource: Mapped[str] = mapped_column(String(512), default="")
    outcome: Mapped[str] = mapped_column(String(32))
    status: Mapped[int] = mapped_column(Integer)
    client: Mapped[str] = mapped_column(String(64), default="")
    detail: Mapped[str] = mapped_column(String(256), default="")


class OfflineAction(Base):
    """Something ``kiln admin`` did to the database with no server running (a recovery key), for the next server
    start to announce in its log. Written in the transaction of the action and of its audit event; a server marks
    it ``announced_at`` once it has logged it."""

    __tablename__ = "offline_actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    action: Mapped[str] = mapped_column(String(96))
    audit_event_id: Mapped[int | None] = mapped_column(Integer, default=None)  # no foreign key: audit rows expire
    message: Mapped[str] = mapped_column(Text)
    announced_at: Mapped[datetime | None] = mapped_column(default=None)
