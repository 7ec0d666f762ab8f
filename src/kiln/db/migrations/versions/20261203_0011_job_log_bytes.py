"""job log bytes: the size of each job's log when its last attempt ended, counted in its organisation's storage

Revision ID: 20261203_0011
Revises: 20261202_0010
"""

import sqlalchemy as sa
from alembic import op

revision = "20261203_0011"
down_revision = "20261202_0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("log_bytes", sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("log_bytes")
