"""Pipelines (kiln.domain.pipelines): a run of a pipeline spec and its steps. A job step's row points at the job
that ran it (or, cached, at the earlier job whose result it reuses); its ``cache_key`` is what makes that reuse
sound."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class PipelineRun(Base):
    __tablename__ = "pipeline_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # as submitted (the steps' code digests filled in)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)  # the steps' default code
    use_cache: Mapped[bool] = mapped_column(Boolean, default=True)
    state: Mapped[str] = mapped_column(String(16), index=True)  # RUNNING | SUCCEEDED | FAILED | CANCELLED
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_pipeline_runs_org_created", "org_id", "created_at"),)


class PipelineStep(Base):
    __tablename__ = "pipeline_steps"

    run_id: Mapped[str] = mapped_column(ForeignKey("pipeline_runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    position: Mapped[int] = mapped_column(Integer)  # in the pipeline's dependency order
    kind: Mapped[str] = mapped_column(String(16))  # job | register_model | serve
    # WAITING | RUNNING | SUCCEEDED | CACHED | FAILED | SKIPPED | CANCELLED
    state: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(String(32), default=None)  # its (last) job, or the cached one
    tries: Mapped[int] = mapped_column(Integer, default=0)  # jobs started for it since the run (or its resume) began
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # jobs started for it, ever (its jobs' pipeline-try)
    retry_at: Mapped[datetime | None] = mapped_column(default=None)
    cache_key: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    cached: Mapped[bool] = mapped_column(Boolean, default=False)
    result: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # a built-in step's: model version, service
    message: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class PipelineSchedule(Base):
    """A pipeline started on a cron schedule: each time ``next_at`` has passed, one run (its job steps checked
    again then, their datasets' latest versions pinned), and ``next_at`` moves to the first time after now: a
    server that was down across several times starts one run when it comes back, never one per missed time."""

    __tablename__ = "pipeline_schedules"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the pipeline, as submitted
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    use_cache: Mapped[bool] = mapped_column(Boolean, default=True)
    cron: Mapped[str] = mapped_column(String(128))  # in UTC; a sixth field is seconds
    next_at: Mapped[datetime] = mapped_column(index=True)
    last_run_id: Mapped[str | None] = mapped_column(String(32), default=None)
    last_at: Mapped[datetime | None] = mapped_column(default=None)
    message: Mapped[str] = mapped_column(Text, default="")  # why the last time started no run, if it did not
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
