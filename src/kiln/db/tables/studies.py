"""Tuning studies, their trials and events."""

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


class TuningStudy(Base):
    """A hyperparameter tuning study (kiln.domain.studies): its spec, state, and the counts and best trial the
    driver keeps current. Its sampler's and pruner's own records are Optuna's, in Optuna's tables."""

    __tablename__ = "tuning_studies"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(64), default=None)
    message: Mapped[str | None] = mapped_column(Text, default=None)
    planned_trials: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ix_tuning_studies_org_created", "org_id", "created_at"),)


class TuningTrial(Base):
    """One trial of a study: the Optuna trial it is, the job that runs it, and what the driver saw of it.
    ``reported_seq`` is how far the objective's points were fed to the pruner; ``told`` whether Optuna was told
    the trial's end (the row's final state is written first, so a crash between the two is finished later)."""

    __tablename__ = "tuning_trials"

    study_id: Mapped[str] = mapped_column(ForeignKey("tuning_studies.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    optuna_trial_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), default=None, index=True)
    state: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    value: Mapped[float | None] = mapped_column(Float(precision=53), default=None)
    reported_seq: Mapped[int] = mapped_column(BigInteger, default=-1)
    last_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    last_value: Mapped[float | None] = mapped_column(Float(precision=53), default=None)
    pruned_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # Why the pruner stopped it (kiln.domain.studies.PruneReport): its value at the rung, the cutoff, how many others.
    prune_report: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    told: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (Index("ux_tuning_trials_optuna", "study_id", "optuna_trial_id", unique=True),)


class TuningEvent(Base):
    __tablename__ = "tuning_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("tuning_studies.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    from_state: Mapped[str | None] = mapped_column(String(16), default=None)
    to_state: Mapped[str | None] = mapped_column(String(16), default=None)
    reason: Mapped[str] = mapped_column(String(64))
    trial: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str] = mapped_column(Text, default="")
