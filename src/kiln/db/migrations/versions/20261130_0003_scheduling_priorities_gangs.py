"""scheduling: priorities, gangs, preemption, fair-share weights

Revision ID: 20261130_0003
Revises: 20261130_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "20261130_0003"
down_revision = "20261130_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("workers", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("preempt_reason", sa.Text(), nullable=True))

    with op.batch_alter_table("organizations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("share_weight", sa.Float(), server_default="1.0", nullable=False))
        batch_op.add_column(sa.Column("max_priority", sa.String(length=16), server_default="normal", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("organizations", schema=None) as batch_op:
        batch_op.drop_column("max_priority")
        batch_op.drop_column("share_weight")

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("preempt_reason")
        batch_op.drop_column("workers")
        batch_op.drop_column("priority")
