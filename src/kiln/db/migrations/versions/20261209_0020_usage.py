"""usage metering: each attempt's hold of CPUs, memory and GPUs in time; prices, versioned

Revision ID: 20261209_0020
Revises: 20261208_0019
"""

import sqlalchemy as sa
from alembic import op

revision = "20261209_0020"
down_revision = "20261208_0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("cpus", sa.Float(), nullable=False),
        sa.Column("memory", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("start_ts", sa.Float(), nullable=False),
        sa.Column("end_ts", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_usage_records_org_start", "usage_records", ["org_id", "start_ts"])
    op.create_index("ix_usage_records_job_attempt", "usage_records", ["job_id", "attempt"])
    op.create_index("ix_usage_records_open", "usage_records", ["end_ts"])
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("effective_ts", sa.Float(), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("resource", sa.String(length=16), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name="fk_prices_created_by_users"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_prices_effective_ts", "prices", ["effective_ts"])


def downgrade() -> None:
    op.drop_table("prices")
    op.drop_table("usage_records")
