"""Experiment tracking: experiments, runs, their params and tags. Every job is a run (the run's id is the job's),
and a run logged from outside Kiln (the MLflow client on a laptop) is a run without a job. A run's metrics are
the metrics store's series (``metric_series.job_id`` holds the run's id)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class Experiment(Base):
    """A named group of an organisation's runs (``Default`` unless a job or the client names another)."""

    __tablename__ = "experiments"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(256))
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")  # active | deleted
    tags: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_experiments_org_name", "org_id", "name", unique=True),)


class Run(Base):
    """One run: a job's (``job_id`` set, ``id`` the job's id; its state is the job's) or one logged from outside
    (its ``status`` and times are what the client set)."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    experiment_id: Mapped[str] = mapped_column(ForeignKey("experiments.id"))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), default=None)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(256), default="")
    status: Mapped[str] = mapped_column(String(16), default="RUNNING")  # RUNNING|SCHEDULED|FINISHED|FAILED|KILLED
    start_time: Mapped[int | None] = mapped_column(BigInteger, default=None)  # ms since the epoch
    end_time: Mapped[int | None] = mapped_column(BigInteger, default=None)
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")  # active | deleted
    # Bytes of its artifacts in the store (a run without a job; a job's artifacts are its outputs): storage quota.
    artifact_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_runs_experiment_start", "experiment_id", "start_time"),
        Index("ix_runs_org", "org_id"),
        Index("ix_runs_job", "job_id"),
    )


class RunParam(Base):
    """A run's parameter: its text as logged, and its value as a number where the text is one (what a numeric
    filter such as ``params.lr < 0.1`` compares)."""

    __tablename__ = "run_params"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    number: Mapped[float | None] = mapped_column(Float, default=None)

    __table_args__ = (Index("ix_run_params_key_number", "key", "number"),)


class RunTag(Base):
    __tablename__ = "run_tags"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class LoggedModel(Base):
    """A model logged the MLflow 3 way (``mlflow.<flavor>.log_model``): MLflow's client records it before it uploads
    the model's directory (``MLmodel`` and the flavor's files), which Kiln keeps under
    ``orgs/<org>/logged-models/<id>/artifacts``. It belongs to its organisation; ``run_id`` is the run that logged
    it (a job's run or one from outside), if any."""

    __tablename__ = "logged_models"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    experiment_id: Mapped[str] = mapped_column(ForeignKey("experiments.id"))
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), default=None)
    name: Mapped[str] = mapped_column(String(256))
    model_type: Mapped[str | None] = mapped_column(String(256), default=None)
    status: Mapped[str] = mapped_column(String(32), default="LOGGED_MODEL_PENDING")
    status_message: Mapped[str | None] = mapped_column(Text, default=None)
    tags: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")  # active | deleted
    # Bytes of its files in the store: counted against the organisation's storage quota with run artifacts.
    artifact_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_logged_models_org_experiment", "org_id", "experiment_id"),
        Index("ix_logged_models_run", "run_id"),
    )
