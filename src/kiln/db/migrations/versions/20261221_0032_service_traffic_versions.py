"""service traffic per model version (issue 48): what each server forwarded to each version of a service (counts and
latency histogram), so that a canary's rollout policy judges the predicts of every live server.

Revision ID: 20261221_0032
Revises: 20261220_0031
"""

import sqlalchemy as sa
from alembic import op

revision = "20261221_0032"
down_revision = "20261220_0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("service_traffic") as batch:
        batch.add_column(sa.Column("versions", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("service_traffic") as batch:
        batch.drop_column("versions")
