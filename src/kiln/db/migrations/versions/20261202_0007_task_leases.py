"""task leases: which server runs a background task of one scope, with a fencing token

Revision ID: 20261202_0007
Revises: 20261130_0006
"""

import sqlalchemy as sa
from alembic import op

revision = "20261202_0007"
down_revision = "20261130_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_leases",
        sa.Column("scope", sa.String(length=96), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope"),
    )


def downgrade() -> None:
    op.drop_table("task_leases")
