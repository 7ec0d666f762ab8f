"""service routes: where each ready replica (and a backend's service address) is reached, and each server's
traffic per service, so that every server on the database routes predicts and the serving task scales on all of
their requests

Revision ID: 20261203_0014
Revises: 20261203_0013
"""

import sqlalchemy as sa
from alembic import op

revision = "20261203_0014"
down_revision = "20261203_0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("service_replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("socket", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("secret", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("node", sa.String(length=255), nullable=True))
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.add_column(sa.Column("route_url", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("route_secret", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("route_model", sa.String(length=200), nullable=True))
    op.create_table(
        "service_traffic",
        sa.Column("server_id", sa.String(length=128), nullable=False),
        sa.Column("service_id", sa.String(length=32), nullable=False),
        sa.Column("in_flight", sa.Integer(), nullable=False),
        sa.Column("replica_in_flight", sa.JSON(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("last_request_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["service_id"], ["services.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("server_id", "service_id"),
    )
    op.create_index("ix_service_traffic_service_id", "service_traffic", ["service_id"])


def downgrade() -> None:
    op.drop_index("ix_service_traffic_service_id", table_name="service_traffic")
    op.drop_table("service_traffic")
    with op.batch_alter_table("services", schema=None) as batch_op:
        batch_op.drop_column("route_model")
        batch_op.drop_column("route_secret")
        batch_op.drop_column("route_url")
    with op.batch_alter_table("service_replicas", schema=None) as batch_op:
        batch_op.drop_column("node")
        batch_op.drop_column("secret")
        batch_op.drop_column("socket")
