"""tenancy quotas and audit

Revision ID: 20261130_0002
Revises: 20261130_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "20261130_0002"
down_revision = "20261130_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=True),
        sa.Column("user_id", sa.String(length=32), nullable=True),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=96), nullable=False),
        sa.Column("resource", sa.String(length=512), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.String(length=256), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_events_org_id"), ["org_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_events_time"), ["time"], unique=False)

    op.create_table(
        "quotas",
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.Column("cpus", sa.Float(), nullable=True),
        sa.Column("memory", sa.BigInteger(), nullable=True),
        sa.Column("count", sa.Integer(), nullable=True),
        sa.Column("storage", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["org_id"],
            ["organizations.id"],
        ),
        sa.PrimaryKeyConstraint("org_id", "category"),
    )
    with op.batch_alter_table("access_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("description", sa.String(length=256), server_default="", nullable=False))

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("category", sa.String(length=16), server_default="train", nullable=False))
        batch_op.add_column(sa.Column("output_bytes", sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("output_bytes")
        batch_op.drop_column("category")

    with op.batch_alter_table("access_keys", schema=None) as batch_op:
        batch_op.drop_column("description")

    op.drop_table("quotas")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_events_time"))
        batch_op.drop_index(batch_op.f("ix_audit_events_org_id"))

    op.drop_table("audit_events")
