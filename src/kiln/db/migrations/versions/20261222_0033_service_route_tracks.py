"""service route tracks (issue 48): where every server routes a deployed service's canary and shadow (a Kubernetes
Deployment and Service of their own), beside the stable track's ``route_url``.

Revision ID: 20261222_0033
Revises: 20261221_0032
"""

import sqlalchemy as sa
from alembic import op

revision = "20261222_0033"
down_revision = "20261221_0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.add_column(sa.Column("route_tracks", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.drop_column("route_tracks")
