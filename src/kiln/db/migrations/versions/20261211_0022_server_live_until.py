"""servers: each row says until when it is live, by its own server's heartbeat (servers whose heartbeats differ
counted each other by the counter's own, so one with a longer heartbeat was live only part of the time)

Revision ID: 20261211_0022
Revises: 20261210_0021
"""

import sqlalchemy as sa
from alembic import op

revision = "20261211_0022"
down_revision = "20261210_0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("servers") as batch:
        batch.add_column(sa.Column("live_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("servers") as batch:
        batch.drop_column("live_until")
