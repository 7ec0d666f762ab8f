"""a job's run keeps its end time (the job's end), so that runs are searched and sorted by it on the server

Revision ID: 20261206_0017
Revises: 20261205_0016
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "20261206_0017"
down_revision = "20261205_0016"
branch_labels = None
depends_on = None

BATCH = 1000


def _millis(value: object) -> int:
    if isinstance(value, str):  # SQLite hands the stored text back
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    if value.tzinfo is None:  # stored as UTC
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def upgrade() -> None:
    conn = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.String), sa.column("end_time", sa.BigInteger))
    rows = conn.execute(
        sa.text(
            "SELECT runs.id, jobs.finished_at FROM runs JOIN jobs ON jobs.id = runs.job_id "
            "WHERE runs.end_time IS NULL AND jobs.finished_at IS NOT NULL"
        )
    ).all()
    update = sa.update(runs).where(runs.c.id == sa.bindparam("run_id")).values(end_time=sa.bindparam("end"))
    for start in range(0, len(rows), BATCH):
        conn.execute(update, [{"run_id": run_id, "end": _millis(at)} for run_id, at in rows[start : start + BATCH]])


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("UPDATE runs SET end_time = NULL WHERE job_id IS NOT NULL"))
