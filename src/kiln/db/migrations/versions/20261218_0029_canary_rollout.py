"""canary rollout policies (issue 48): a canary's policy (its bounds and steps), when its share last changed, and the
moves a service's rollouts made (advanced, promoted, rolled back), newest last and bounded.

Revision ID: 20261218_0029
Revises: 20261217_0028
"""

import sqlalchemy as sa
from alembic import op

revision = "20261218_0029"
down_revision = "20261217_0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.add_column(sa.Column("canary_policy", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("canary_step_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("rollout_events", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("services") as batch:
        batch.drop_column("rollout_events")
        batch.drop_column("canary_step_at")
        batch.drop_column("canary_policy")
