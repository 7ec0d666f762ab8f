"""usage: what each hold used (CPU seconds, peak memory) beside what it held; holds summed by hour and day; budgets

Revision ID: 20261210_0021
Revises: 20261209_0020
"""

import sqlalchemy as sa
from alembic import op

revision = "20261210_0021"
down_revision = "20261209_0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("used_cpu_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("peak_memory", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("rolled", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("long_hold", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_usage_records_start", "usage_records", ["start_ts"])
    op.create_index("ix_usage_records_rolled", "usage_records", ["rolled", "end_ts"])
    op.create_index("ix_usage_records_long", "usage_records", ["long_hold", "end_ts"])
    for table, unit in (("usage_hours", "hours"), ("usage_days", "days")):
        op.create_table(
            table,
            sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("at", sa.BigInteger(), nullable=False),
            sa.Column("day", sa.String(length=10), nullable=False),
            sa.Column("org_id", sa.String(length=32), nullable=False),
            sa.Column("user_id", sa.String(length=32), nullable=False),
            sa.Column("category", sa.String(length=16), nullable=False),
            sa.Column("gpu_type", sa.String(length=64), nullable=False),
            sa.Column("attempts", sa.Integer(), nullable=False),
            sa.Column("cpu_seconds", sa.Float(), nullable=False),
            sa.Column("memory_gib_seconds", sa.Float(), nullable=False),
            sa.Column("gpu_seconds", sa.Float(), nullable=False),
            sa.Column("cost", sa.Float(), nullable=False),
            sa.Column("used_cpu_seconds", sa.Float(), nullable=False),
            sa.Column("peak_memory", sa.BigInteger(), nullable=False),
            sa.PrimaryKeyConstraint("id"),
            sa.UniqueConstraint("at", "org_id", "user_id", "category", "gpu_type", name=f"uq_usage_{unit}_key"),
        )
        op.create_index(f"ix_usage_{unit}_org_at", table, ["org_id", "at"])
    op.create_table(
        "budgets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("soft", sa.Float(), nullable=True),
        sa.Column("hard", sa.Float(), nullable=True),
        sa.Column("stop_running", sa.Boolean(), nullable=False),
        sa.Column("warned_month", sa.String(length=7), nullable=False),
        sa.Column("stopped_month", sa.String(length=7), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_budgets_org_id_organizations"),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name="fk_budgets_created_by_users"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("org_id", "user_id", name="uq_budgets_org_user"),
    )


def downgrade() -> None:
    op.drop_table("budgets")
    op.drop_table("usage_days")
    op.drop_table("usage_hours")
    op.drop_index("ix_usage_records_long", "usage_records")
    op.drop_index("ix_usage_records_rolled", "usage_records")
    op.drop_index("ix_usage_records_start", "usage_records")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("long_hold")
        batch.drop_column("rolled")
        batch.drop_column("peak_memory")
        batch.drop_column("used_cpu_seconds")
