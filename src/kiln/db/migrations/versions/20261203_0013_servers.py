"""servers: each server using the database, seen every heartbeat (the live count that shares the rate limits)

Revision ID: 20261203_0013
Revises: 20261203_0012
"""

import sqlalchemy as sa
from alembic import op

revision = "20261203_0013"
down_revision = "20261203_0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "servers",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_servers_seen_at", "servers", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_servers_seen_at", table_name="servers")
    op.drop_table("servers")
