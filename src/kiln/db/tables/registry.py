"""The model registry: models, versions, their files, aliases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class Model(Base):
    """A registered model of an organisation (kiln.domain.models): its versions are numbered from 1 and a number
    is never given twice while the model exists (``latest_version`` is the highest given so far)."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    name: Mapped[str] = mapped_column(String(100))
    latest_version: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_models_org_name", "org_id", "name", unique=True),)


class ModelVersion(Base):
    """An immutable version: files copied from a job's outputs, and its lineage. The job is not a foreign key:
    the lineage (its id, spec and metrics, copied here) outlives the job."""

    __tablename__ = "model_versions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    framework: Mapped[str] = mapped_column(String(16))
    description: Mapped[str | None] = mapped_column(Text, default=None)
    source_path: Mapped[str] = mapped_column(String(1024))
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    job_name: Mapped[str | None] = mapped_column(String(128), default=None)
    job_state: Mapped[str | None] = mapped_column(String(16), default=None)
    job_spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)  # name -> the last value of each scalar series
    study_id: Mapped[str | None] = mapped_column(String(32), default=None)
    trial_number: Mapped[int | None] = mapped_column(Integer, default=None)
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Registered from a run (``--from-run``): the run, the logged model (if it came from one), and what its MLmodel
    # file says: the flavor its predictor loads and the signature requests are checked against. Not foreign keys,
    # as job_id: the lineage outlives them. ``job_id`` is "" for a run logged from outside Kiln.
    run_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    logged_model_id: Mapped[str | None] = mapped_column(String(40), default=None)
    flavor: Mapped[str | None] = mapped_column(String(64), default=None)
    signature: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    __table_args__ = (Index("ux_model_versions_number", "model_id", "version", unique=True),)


class ModelFile(Base):
    """One file of a model version: its path in the version and the data blob (``data_blobs``, shared with
    datasets) that holds its bytes."""

    __tablename__ = "model_files"

    version_id: Mapped[str] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))

    __table_args__ = (Index("ix_model_files_org_sha", "org_id", "sha256"),)


class ModelAlias(Base):
    """A movable name of one version of a model (``production`` → 3)."""

    __tablename__ = "model_aliases"

    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(String(32))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
