"""tuning_trials: ``prune_report``, why the pruner stopped a trial (issue 50): the rule, the rung it was judged at,
its value there, the cutoff it had to reach and how many other trials' values that cutoff came from. NULL for the
trials of every other state, and for trials pruned before this revision (their ``message`` names the step).

Revision ID: 20261215_0026
Revises: 20261214_0025 (renumbered by the lead: 0025 is logged_models, committed first)
"""

import sqlalchemy as sa
from alembic import op

revision = "20261215_0026"
down_revision = "20261214_0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuning_trials") as batch:
        batch.add_column(sa.Column("prune_report", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuning_trials") as batch:
        batch.drop_column("prune_report")
