"""Jobs' metrics: series, points, M4 chunks, ingestion cursors."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
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


class MetricSeries(Base):
    """One metric of one run's member (``worker0``): scalar or text, its x axis, and running totals for summaries.
    ``job_id`` is the run's id (a job's run has the job's id; a run logged from outside Kiln has none)."""

    __tablename__ = "metric_series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # No foreign key: a run logged from outside Kiln has series and no job; deleting a run or a job deletes its
    # series by name (job_removal, tracking), as the bulk engine (SQLite without foreign keys) needs anyway.
    job_id: Mapped[str] = mapped_column(String(32))
    worker: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(8))  # scalar | text
    source: Mapped[str] = mapped_column(String(8), default="sdk")  # sdk | log | tb | sys | api
    axis: Mapped[str] = mapped_column(String(4), default="step")  # step | time: the x axis of its plots
    count: Mapped[int] = mapped_column(BigInteger, default=0)  # points so far (also the next point's seq)
    first_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    last_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    last_time: Mapped[float | None] = mapped_column(Float, default=None)
    last_value: Mapped[float | None] = mapped_column(Float, default=None)
    last_text: Mapped[str | None] = mapped_column(Text, default=None)
    min_value: Mapped[float | None] = mapped_column(Float, default=None)
    max_value: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ux_metric_series_job_worker_name", "job_id", "worker", "name", unique=True),
        # A search sorted by a metric: each run's last value of it from the index alone
        # (kiln.usecases.tracking.run_query).
        Index("ix_metric_series_name_job_value", "name", "job_id", "last_value"),
    )


class MetricPoint(Base):
    """A point of a series. ``seq`` numbers a series' points in arrival order; ``value`` holds finite numbers,
    ``text`` strings and the non-finite numbers ("nan", "inf", "-inf": SQLite cannot store a NaN)."""

    __tablename__ = "metric_points"

    series_id: Mapped[int] = mapped_column(ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    time: Mapped[float] = mapped_column(Float(precision=53))
    value: Mapped[float | None] = mapped_column(Float(precision=53), default=None)
    text: Mapped[str | None] = mapped_column(Text, default=None)

    __table_args__ = (Index("ix_metric_points_series_step", "series_id", "step"),)


class MetricChunk(Base):
    """The M4 summary (first, last, min and max point) of ``seq // CHUNK`` of a series' finite numeric points,
    kept up to date at ingestion: downsampling a long series reads these instead of every point."""

    __tablename__ = "metric_chunks"

    series_id: Mapped[int] = mapped_column(ForeignKey("metric_series.id", ondelete="CASCADE"), primary_key=True)
    chunk: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(Integer)
    first_x: Mapped[float] = mapped_column(Float(precision=53))
    first_t: Mapped[float] = mapped_column(Float(precision=53))
    first_v: Mapped[float] = mapped_column(Float(precision=53))
    last_x: Mapped[float] = mapped_column(Float(precision=53))
    last_t: Mapped[float] = mapped_column(Float(precision=53))
    last_v: Mapped[float] = mapped_column(Float(precision=53))
    min_x: Mapped[float] = mapped_column(Float(precision=53))
    min_t: Mapped[float] = mapped_column(Float(precision=53))
    min_v: Mapped[float] = mapped_column(Float(precision=53))
    max_x: Mapped[float] = mapped_column(Float(precision=53))
    max_t: Mapped[float] = mapped_column(Float(precision=53))
    max_v: Mapped[float] = mapped_column(Float(precision=53))


class MetricCursor(Base):
    """How far a job's spool file has been ingested (bytes); advanced in the transaction that stores its points."""

    __tablename__ = "metric_cursors"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    file: Mapped[str] = mapped_column(String(255), primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)  # malformed lines skipped so far
    reported: Mapped[bool] = mapped_column(Boolean, default=False)  # the one MetricsSpoolError event was written
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
