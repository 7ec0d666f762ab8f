"""service canaries (issue 48): a service's canary version, its percentage of predicts and its replicas; which
replicas are the canary's.

Revision ID: 20261217_0028
Revises: 20261216_0027
"""

import sqlalchemy as sa
from alembic import op

revision = "20261217_0028"
down_revision = "20261216_0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.add_column(sa.Column("canary_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("canary_weight", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("canary_replicas", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("service_replicas") as batch:
        batch.add_column(sa.Column("canary", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("service_replicas") as batch:
        batch.drop_column("canary")
    with op.batch_alter_table("services") as batch:
        batch.drop_column("canary_replicas")
        batch.drop_column("canary_weight")
        batch.drop_column("canary_version")
