"""notebooks: JupyterLab environments of an organisation, each start a job of category dev

Revision ID: 20261204_0015
Revises: 20261203_0014
"""

import sqlalchemy as sa
from alembic import op

revision = "20261204_0015"
down_revision = "20261203_0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notebooks",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("desired", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("ready_job", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("last_activity", sa.DateTime(timezone=True), nullable=True),
        sa.Column("home_size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_notebooks_job_id", "notebooks", ["job_id"])
    op.create_index("ux_notebooks_org_name", "notebooks", ["org_id", "name"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_notebooks_org_name", table_name="notebooks")
    op.drop_index("ix_notebooks_job_id", table_name="notebooks")
    op.drop_table("notebooks")
