"""Usage metering: what each attempt of a job held (its allocation: CPUs, memory, GPUs, every gang member's) from
the scheduler's placement to the release, and the prices an operator sets for it, versioned in time."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class UsageRecord(Base):
    """One attempt's hold, opened in the transaction that places it (STARTING) and closed in the one that
    releases it (its end, a restart, a preemption): ``end_ts`` NULL while it holds, so its use so far is the time
    since ``start_ts``. Times are seconds since the epoch (sums in SQL, alike on SQLite and PostgreSQL)."""

    __tablename__ = "usage_records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    category: Mapped[str] = mapped_column(String(16))  # train | serve | dev
    cpus: Mapped[float] = mapped_column(Float)  # every member's together
    memory: Mapped[int] = mapped_column(BigInteger, default=0)  # bytes (0: no limit was set)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_type: Mapped[str] = mapped_column(String(64), default="")  # the spec's gpu_type ("" when it named none)
    start_ts: Mapped[float] = mapped_column(Float)
    end_ts: Mapped[float | None] = mapped_column(Float, default=None)
    # What it used, from its system metrics (``system/cpu_seconds``, ``system/rss_bytes``, every worker's),
    # written when the hold closes; NULL while it holds (read from the metrics then) or where none were sampled.
    used_cpu_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    peak_memory: Mapped[int | None] = mapped_column(BigInteger, default=None)  # bytes, every worker's peak summed
    # Added into usage_hours (once settled): reports read it from there, but for the edges of their window.
    rolled: Mapped[bool] = mapped_column(Boolean, default=False)
    long_hold: Mapped[bool] = mapped_column(Boolean, default=False)  # rolled, and held longer than a day

    __table_args__ = (
        Index("ix_usage_records_org_start", "org_id", "start_ts"),
        Index("ix_usage_records_start", "start_ts"),
        Index("ix_usage_records_job_attempt", "job_id", "attempt"),
        Index("ix_usage_records_open", "end_ts"),
        Index("ix_usage_records_rolled", "rolled", "end_ts"),
        Index("ix_usage_records_long", "long_hold", "end_ts"),
    )


class _UsageSum:
    """What the settled holds of one organisation's user, category and GPU type held in one period (``at``: its
    start, seconds since the epoch; ``day``: its UTC day), each hold split at the periods it spans and priced
    piece by piece. Reports sum these for the whole periods of their window."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[int] = mapped_column(BigInteger)
    day: Mapped[str] = mapped_column(String(10))
    org_id: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(32))
    category: Mapped[str] = mapped_column(String(16))
    gpu_type: Mapped[str] = mapped_column(String(64))
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # holds that began in the period
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    memory_gib_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    used_cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    peak_memory: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageHour(_UsageSum, Base):
    """Settled holds summed by UTC hour: a report's part-days (a month over a million attempts reads a month of
    days and two days of hours, not the million)."""

    __tablename__ = "usage_hours"
    __table_args__ = (
        UniqueConstraint("at", "org_id", "user_id", "category", "gpu_type", name="uq_usage_hours_key"),
        Index("ix_usage_hours_org_at", "org_id", "at"),
    )


class UsageDay(_UsageSum, Base):
    """Settled holds summed by UTC day: a report's whole days."""

    __tablename__ = "usage_days"
    __table_args__ = (
        UniqueConstraint("at", "org_id", "user_id", "category", "gpu_type", name="uq_usage_days_key"),
        Index("ix_usage_days_org_at", "org_id", "at"),
    )


class Price(Base):
    """One rate of a price version: from ``effective_ts`` on (until the next version), per hour of one
    ``resource`` (cpu, memory_gib, gpu) in ``category`` ("*": any) and, for GPUs, of ``gpu_type`` ("*": any).
    Each version holds every rate (those not changed are carried over from the one before)."""

    __tablename__ = "prices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    effective_ts: Mapped[float] = mapped_column(Float, index=True)
    category: Mapped[str] = mapped_column(String(16), default="*")
    resource: Mapped[str] = mapped_column(String(16))
    gpu_type: Mapped[str] = mapped_column(String(64), default="*")
    rate: Mapped[float] = mapped_column(Float)  # per hour (per GiB-hour for memory)
    created_by: Mapped[str] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Budget(Base):
    """A monthly budget (calendar months, UTC) on an organisation's cost (``user_id`` "") or one member's: past
    ``soft`` new work is warned of (an event on each job, the audit once a month, a banner), past ``hard`` it is
    refused (403 naming the budget); with ``stop_running`` the running work of its scope is stopped too."""

    __tablename__ = "budgets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(String(32), default="")  # "": the whole organisation
    soft: Mapped[float | None] = mapped_column(Float, default=None)
    hard: Mapped[float | None] = mapped_column(Float, default=None)
    stop_running: Mapped[bool] = mapped_column(Boolean, default=False)
    warned_month: Mapped[str] = mapped_column(String(7), default="")  # "2026-12": the soft limit was audited
    stopped_month: Mapped[str] = mapped_column(String(7), default="")  # its running work was stopped
    created_by: Mapped[str] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("org_id", "user_id", name="uq_budgets_org_user"),)
