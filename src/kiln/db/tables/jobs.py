"""Jobs and what schedules them: code blobs, jobs and their events, quotas, task leases, the live servers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


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
    # What the store holds of the job's checkpoints and TensorBoard event files, reserved against its
    # organisation's storage quota before each sync writes (kiln.usecases.data.storage_gate). Event files a job kept
    # before these columns are in output_bytes.
    checkpoint_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    event_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The job's log's size when its latest attempt ended (the live size of a running job's is read from its file).
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
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


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")


class TaskLease(Base):
    """Which server runs a background task of one scope (kiln.tasks.leases): one row per scope. ``token``
    is the fencing token, one higher whenever the lease changes hands or is taken back after it expired."""

    __tablename__ = "task_leases"

    scope: Mapped[str] = mapped_column(String(96), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(BigInteger, default=1)
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()


class Server(Base):
    """A server using this database (kiln.tasks.presence): each writes its row every heartbeat and deletes it
    when it stops; one past its ``live_until`` (three of its own heartbeats after ``seen_at``) is not live any
    more."""

    __tablename__ = "servers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)  # its instance id (the task leases' owner)
    endpoint: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(index=True)
    # seen_at + three of this server's heartbeats: servers whose heartbeats differ judge each other by the other's
    # own (NULL: a row of a server from before this column, judged by the reader's heartbeat).
    live_until: Mapped[datetime | None] = mapped_column(default=None)
    # Which machine and process it is and what it runs (``kiln admin servers``); NULL on a row of a server from
    # before these columns.
    host: Mapped[str | None] = mapped_column(String(255), default=None)
    pid: Mapped[int | None] = mapped_column(Integer, default=None)
    version: Mapped[str | None] = mapped_column(String(64), default=None)


class OutputManifest(Base):
    """An ended job's outputs, each file's path, size and SHA-256, read once: what a job that reads them as an
    input (``inputs: [{job: ID}]``) stages and checks, and what a pipeline's cache keys on. Outputs are final once
    the job has ended, so the manifest never changes; it goes with the job."""

    __tablename__ = "output_manifests"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    files: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [[path, size, sha256], ...], sorted by path
    digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of the sorted (path, sha256) pairs
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
