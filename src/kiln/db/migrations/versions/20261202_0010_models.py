"""the model registry: models, their numbered versions and files (in the data blobs datasets use), aliases

Revision ID: 20261202_0010
Revises: 20261202_0009
"""

import sqlalchemy as sa
from alembic import op

revision = "20261202_0010"
down_revision = "20261202_0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("latest_version", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_models_org_name", "models", ["org_id", "name"], unique=True)
    op.create_table(
        "model_versions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("framework", sa.String(length=16), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("source_path", sa.String(length=1024), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("job_name", sa.String(length=128), nullable=True),
        sa.Column("job_state", sa.String(length=16), nullable=True),
        sa.Column("job_spec", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("study_id", sa.String(length=32), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ux_model_versions_number", "model_versions", ["model_id", "version"], unique=True)
    op.create_index("ix_model_versions_job_id", "model_versions", ["job_id"])
    op.create_table(
        "model_files",
        sa.Column("version_id", sa.String(length=32), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["model_versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("version_id", "path"),
    )
    op.create_index("ix_model_files_org_sha", "model_files", ["org_id", "sha256"])
    op.create_table(
        "model_aliases",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("alias", sa.String(length=63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_by", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("model_id", "alias"),
    )


def downgrade() -> None:
    op.drop_table("model_aliases")
    op.drop_index("ix_model_files_org_sha", table_name="model_files")
    op.drop_table("model_files")
    op.drop_index("ix_model_versions_job_id", table_name="model_versions")
    op.drop_index("ux_model_versions_number", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_index("ux_models_org_name", table_name="models")
    op.drop_table("models")
