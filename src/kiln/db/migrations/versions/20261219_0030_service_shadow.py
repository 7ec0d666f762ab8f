"""service shadows (issue 48): the model version a copy of a service's predicts goes to (answers compared, never
returned), and which replicas are the shadow's.

Revision ID: 20261219_0030
Revises: 20261218_0029
"""

import sqlalchemy as sa
from alembic import op

revision = "20261219_0030"
down_revision = "20261218_0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.add_column(sa.Column("shadow_version", sa.Integer(), nullable=True))
    with op.batch_alter_table("service_replicas") as batch:
        batch.add_column(sa.Column("shadow", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("service_replicas") as batch:
        batch.drop_column("shadow")
    with op.batch_alter_table("services") as batch:
        batch.drop_column("shadow_version")
