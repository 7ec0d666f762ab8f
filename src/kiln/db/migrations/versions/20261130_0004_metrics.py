"""metrics: series, points, M4 chunk summaries and spool cursors

Revision ID: 20261130_0004
Revises: 20261130_0003
"""

import sqlalchemy as sa
from alembic import op

revision = "20261130_0004"
down_revision = "20261130_0003"
branch_labels = None
depends_on = None

DOUBLE = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("worker", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("axis", sa.String(length=4), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("last_time", sa.Float(), nullable=True),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("last_text", sa.Text(), nullable=True),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_metric_series_job_worker_name", "metric_series", ["job_id", "worker", "name"], unique=True)
    op.create_table(
        "metric_points",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("time", DOUBLE, nullable=False),
        sa.Column("value", DOUBLE, nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["series_id"], ["metric_series.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("series_id", "seq"),
    )
    op.create_index("ix_metric_points_series_step", "metric_points", ["series_id", "step"])
    op.create_table(
        "metric_chunks",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("chunk", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        *[
            sa.Column(f"{point}_{field}", DOUBLE, nullable=False)
            for point in ("first", "last", "min", "max")
            for field in ("x", "t", "v")
        ],
        sa.ForeignKeyConstraint(["series_id"], ["metric_series.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("series_id", "chunk"),
    )
    op.create_table(
        "metric_cursors",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("file", sa.String(length=255), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("reported", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "file"),
    )


def downgrade() -> None:
    op.drop_table("metric_cursors")
    op.drop_table("metric_chunks")
    op.drop_index("ix_metric_points_series_step", table_name="metric_points")
    op.drop_table("metric_points")
    op.drop_index("ux_metric_series_job_worker_name", table_name="metric_series")
    op.drop_table("metric_series")
