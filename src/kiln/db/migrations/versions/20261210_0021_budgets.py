"""usage: what each hold used (CPU seconds, peak memory) beside what it held; monthly budgets

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
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("peak_memory")
        batch.drop_column("used_cpu_seconds")
