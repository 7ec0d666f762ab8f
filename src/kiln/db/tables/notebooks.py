"""Notebooks (kiln.domain.notebooks): each one's spec, whether it should run, and the job of its latest start."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class Notebook(Base):
    __tablename__ = "notebooks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # RUNNING: it should run (a start made its job); STOPPED: it should not (a stop, a cull, or its job ended).
    desired: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), default=None, index=True)
    ready_job: Mapped[str | None] = mapped_column(String(32), default=None)  # the job whose JupyterLab answered
    message: Mapped[str] = mapped_column(Text, default="")
    # The newest action through the proxy, as the servers recorded it (a kernel busy counts too: the idle check).
    last_activity: Mapped[datetime | None] = mapped_column(default=None)
    home_size: Mapped[int] = mapped_column(BigInteger, default=0)  # bytes of its home in the store (compressed)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ux_notebooks_org_name", "org_id", "name", unique=True),)
