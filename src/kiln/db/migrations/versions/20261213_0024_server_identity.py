"""servers: each row says which machine and process the server is and the version it runs (host, pid, version),
so that ``kiln admin servers`` can say which server holds which jobs and task leases without a look at the
machines (issue 44: a chaos run read ``jobs.lease_owner`` from the database to find out). NULL on rows written
before this revision: their servers fill them at their next heartbeat.

Revision ID: 20261213_0024
Revises: 20261212_0023
"""

import sqlalchemy as sa
from alembic import op

revision = "20261213_0024"
down_revision = "20261212_0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("servers") as batch:
        batch.add_column(sa.Column("host", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("version", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("servers") as batch:
        batch.drop_column("version")
        batch.drop_column("pid")
        batch.drop_column("host")
