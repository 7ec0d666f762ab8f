"""SQLAlchemy 2 models. Only services and repositories import this module; routes never do."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every database (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


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


class Blob(Base):
    """A content-addressed upload (code bundle) owned by an organisation."""

    __tablename__ = "blobs"

    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(64), default=None)
    message: Mapped[str | None] = mapped_column(Text, default=None)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the scheduler granted (cpus, memory, gpu indices) while STARTING/RUNNING.
    allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    backend: Mapped[str] = mapped_column(String(32), default="local")
    # Backend-specific handle to the running attempt (e.g. the shim's pid and run dir).
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    lease_owner: Mapped[str | None] = mapped_column(String(128), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    not_before: Mapped[datetime | None] = mapped_column(default=None)
    cpus: Mapped[float] = mapped_column(Float, default=1.0)
    memory: Mapped[int | None] = mapped_column(BigInteger, default=None)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    # Quota category the job counts against (train jobs now; serve and dev come with services and notebooks).
    category: Mapped[str] = mapped_column(String(16), default="train", server_default="train")
    output_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Scheduling: priority class (0 low, 1 normal, 2 high), gang size (workers + parameter servers; cpus, memory
    # and gpus above are totals over the gang), and why a preemption was requested while it is under way.
    priority: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    workers: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    preempt_reason: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    running_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_jobs_org_created", "org_id", "created_at"),)


class Quota(Base):
    """Limits of one organisation in one category (or ``total``); NULL means unlimited."""

    __tablename__ = "quotas"

    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    category: Mapped[str] = mapped_column(String(16), primary_key=True)
    gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    cpus: Mapped[float | None] = mapped_column(Float, default=None)
    memory: Mapped[int | None] = mapped_column(BigInteger, default=None)
    count: Mapped[int | None] = mapped_column(Integer, default=None)
    storage: Mapped[int | None] = mapped_column(BigInteger, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


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


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
