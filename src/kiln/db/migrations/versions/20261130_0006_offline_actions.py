"""offline actions: what `kiln admin` did with no server running, for the next start to announce

Revision ID: 20261130_0006
Revises: 20261130_0005
"""

import sqlalchemy as sa
from alembic import op

revision = "20261130_0006"
down_revision = "20261130_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "offline_actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(length=96), nullable=False),
        sa.Column("audit_event_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("announced_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("offline_actions")
