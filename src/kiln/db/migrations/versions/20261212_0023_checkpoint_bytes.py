"""jobs: the bytes the store holds of a job's checkpoints and of its TensorBoard event files, each counted in its
organisation's storage quota and reserved before the sync writes them (issue 43: checkpoints were not counted at
all, and event files only once the job had ended). Existing rows start at 0: their event files are already in
``output_bytes``, where jobs ended before this revision counted them.

Revision ID: 20261212_0023
Revises: 20261211_0022
"""

import sqlalchemy as sa
from alembic import op

revision = "20261212_0023"
down_revision = "20261211_0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("checkpoint_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("event_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("event_bytes")
        batch.drop_column("checkpoint_bytes")
