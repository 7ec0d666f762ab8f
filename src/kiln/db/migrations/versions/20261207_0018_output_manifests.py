"""output manifests: an ended job's outputs, each file's path, size and SHA-256, for jobs that read them as inputs

Revision ID: 20261207_0018
Revises: 20261206_0017
"""

import sqlalchemy as sa
from alembic import op

revision = "20261207_0018"
down_revision = "20261206_0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "output_manifests",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_output_manifests_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )


def downgrade() -> None:
    op.drop_table("output_manifests")
